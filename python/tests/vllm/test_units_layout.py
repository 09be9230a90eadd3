"""Unit tests of the vLLM connector's payload layout: the bytes of a block
gathered from and scattered into vLLM's KV caches, per tile and batched."""
from __future__ import annotations

import pytest
import torch

from kvtier.vllm.layout import LayoutError, PayloadLayout

from conftest import BS, make_caches


@pytest.mark.parametrize("batched", [False, True], ids=["per-tile", "batched"])
def test_payload_round_trip_and_size(batched):
    src = make_caches()
    lay = PayloadLayout(src, list(src), BS, batched=batched)
    assert lay.nbytes == 3 * 2 * BS * 16 * 4
    data = lay.gather([4, 1])
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    out = PayloadLayout(dst, list(dst), BS, batched=batched)
    out.scatter(0, bytes(data[0].numpy()))
    out.scatter(3, memoryview(data[1].numpy()))
    for k in src:
        assert torch.equal(dst[k][0], src[k][4]) and torch.equal(dst[k][3], src[k][1])
        assert not dst[k][1].any()
    with pytest.raises(LayoutError, match="expected"):
        out.scatter(0, b"x" * 10)


@pytest.mark.parametrize("batched", [False, True], ids=["per-tile", "batched"])
def test_payload_is_the_same_whatever_the_kernel_block_size(batched):
    """A cache split into 32-token kernel blocks gives the payload of the same
    tokens held in one 128-token block (canonical token order)."""
    whole = make_caches(blocks=2, dtype=torch.bfloat16)
    split = {k: v.view(2, 2, 4, 32, 16).permute(0, 2, 1, 3, 4).reshape(8, 2, 32, 16).contiguous() for k, v in whole.items()}
    a = PayloadLayout(whole, list(whole), BS).gather([1])
    b = PayloadLayout(split, list(split), BS, batched=batched).gather([1])
    assert torch.equal(a, b)
    back = {k: torch.zeros_like(v) for k, v in split.items()}
    PayloadLayout(back, list(back), BS, batched=batched).scatter(1, bytes(a[0].numpy()))
    for k in split:
        assert torch.equal(back[k][4:8], split[k][4:8])


@pytest.mark.parametrize("split", [1, 4])
def test_batched_copies_match_the_per_tile_ones(split):
    """The accelerator path (one indexed copy per layer) moves exactly the
    bytes of the per-tile path, for many blocks in any order, and touches no
    other block. Run here on the CPU; scripts/gpu-check.py runs it on CUDA."""
    whole = make_caches(layers=4, blocks=9, dtype=torch.float16, seed=3)
    n = BS // split
    src = {k: v.view(9, 2, split, n, 16).permute(0, 2, 1, 3, 4).reshape(9 * split, 2, n, 16).contiguous()
           for k, v in whole.items()}
    ids = [7, 0, 3, 8, 5]
    tile = PayloadLayout(src, list(src), BS, batched=False)
    bat = PayloadLayout(src, list(src), BS, batched=True)
    data = tile.gather(ids)
    assert torch.equal(data, bat.gather(ids))
    payloads = [bytes(r.numpy()) for r in data]
    targets = [1, 2, 4, 6, 8]
    dst_t = {k: torch.zeros_like(v) for k, v in src.items()}
    dst_b = {k: torch.zeros_like(v) for k, v in src.items()}
    PayloadLayout(dst_t, list(dst_t), BS, batched=False).scatter_many(targets, payloads)
    PayloadLayout(dst_b, list(dst_b), BS, batched=True).scatter_many(targets, payloads)
    for k in src:
        assert torch.equal(dst_t[k], dst_b[k])
        for i, t in zip(ids, targets):
            assert torch.equal(dst_b[k][t * split:(t + 1) * split], src[k][i * split:(i + 1) * split])
        for untouched in (0, 3, 5, 7):
            assert not dst_b[k][untouched * split:(untouched + 1) * split].any()
    # Payloads already received into a host buffer's rows are not packed again.
    host = torch.stack([torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads])
    dst_h = {k: torch.zeros_like(v) for k, v in src.items()}
    PayloadLayout(dst_h, list(dst_h), BS, batched=True).scatter_many(targets, [memoryview(r.numpy()) for r in host],
                                                                    host=host)
    assert all(torch.equal(dst_h[k], dst_b[k]) for k in src)
    with pytest.raises(LayoutError, match="2 block ids for 1 payloads"):
        bat.scatter_many([1, 2], payloads[:1])


def test_layout_refuses_mixed_layers():
    c = make_caches()
    c["l1"] = c["l1"].to(torch.bfloat16)
    with pytest.raises(LayoutError, match="unlike the first layer"):
        PayloadLayout(c, list(c), BS)
    with pytest.raises(LayoutError, match="without layers"):
        PayloadLayout(make_caches(), ["nope"], BS)


def test_staging_rows_are_reused_once_given_back():
    caches = make_caches(layers=2, blocks=4)
    lay = PayloadLayout(caches, list(caches), BS)
    a = lay.staging_rows(4)
    assert tuple(a.shape) == (4, lay.nbytes)
    b = lay.staging_rows(2)
    assert b.data_ptr() != a.data_ptr(), "a buffer in use is never handed out twice"
    lay.release_rows(a)
    c = lay.staging_rows(3)
    assert c.data_ptr() == a.data_ptr() and tuple(c.shape) == (3, lay.nbytes), "the given-back buffer is reused"
    d = lay.staging_rows(3)
    assert d.data_ptr() != a.data_ptr(), "taken again: not free until given back"
    lay.release_rows(c)  # a view: its whole buffer comes back
    lay.release_rows(b)  # smaller: the larger one is kept
    e = lay.staging_rows(4)
    assert e.data_ptr() == a.data_ptr()
    assert lay.staging_rows(5).data_ptr() != a.data_ptr(), "too small for 5 rows: a fresh buffer"


def test_blocks_land_in_place_one_region_per_layer():
    """Where each layer's tile of a block is one range of memory, a block's
    destination is one region per layer of vLLM's own cache, in payload order:
    payload bytes written into them in turn equal a scatter of that payload.
    A cache split into kernel blocks, or not contiguous, has no such regions."""
    src = make_caches(layers=3, blocks=6, dtype=torch.bfloat16, seed=4)
    lay = PayloadLayout(src, list(src), BS)
    data = lay.gather([5, 2])
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    out = PayloadLayout(dst, list(dst), BS)
    assert out.loads_in_place
    for regions, row in zip(out.block_regions([0, 4]), data):
        assert len(regions) == 3
        payload, pos = row.numpy(), 0
        for r in regions:
            r[:] = payload[pos:pos + r.nbytes]
            pos += r.nbytes
        assert pos == lay.nbytes
    for k in src:
        assert torch.equal(dst[k][0], src[k][5]) and torch.equal(dst[k][4], src[k][2])
        assert not dst[k][1].any() and not dst[k][3].any()
    split = {k: v.view(6, 2, 4, 32, 16).permute(0, 2, 1, 3, 4).reshape(24, 2, 32, 16).contiguous()
             for k, v in src.items()}
    assert not PayloadLayout(split, list(split), BS).loads_in_place
    strided = {k: v.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for k, v in src.items()}
    assert not PayloadLayout(strided, list(strided), BS).loads_in_place
    with pytest.raises(LayoutError, match="in place"):
        PayloadLayout(split, list(split), BS).block_regions([0])
