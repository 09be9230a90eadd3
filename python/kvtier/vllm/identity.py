"""What makes two engines' KV interchangeable, turned into a kvtier namespace.

A block's key is a hash of its tokens only, so everything else that changes
the KV tensors of those tokens must separate the namespaces, or one engine
would load another's KV and produce wrong text with no error anywhere:

* **the model**: its name or path, revision, dtype, quantization, the whole
  Hugging Face config (shapes, RoPE scaling, ...) and, for a model loaded from
  a local directory, a fingerprint of the weight files (name, size and a hash
  of their first and last MiB: two random-weight models of the same shape in
  the same directory differ there). ``model_id`` in the connector's config
  replaces the name/path/revision/weights part when an operator knows better
  (e.g. the same weights mounted at different paths);
* **the KV layout**: the KV-cache spec vLLM derived (block size, KV heads,
  head size, cache dtype, quantization, padding), the device type (CPU and
  GPU backends may pack a page differently), the layers in order (with
  pipeline parallelism, how the layers are split between stages instead);
* **parallelism**: tensor- and pipeline-parallel size and this rank (each
  rank holds its own heads or layers);
* **the payload format version** of this connector;
* **the KV-cache group** of a hybrid model (several groups: sliding-window
  and global layers, docs/vllm.md "Hybrid models"): each group's layers, spec
  and index, so two groups never share a key. A model with one group keeps
  the namespace it always had.

All of it is hashed (SHA-256, 80 bits kept) into a namespace such as
``vllm/small/3f9a0c1d2e4b5a6f7c8d`` (at most 128 characters), preceded by the
optional ``namespace_prefix``. The readable middle part is for operators; only
the digest decides.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["PAYLOAD_FORMAT", "EngineIdentity", "weights_fingerprint", "unsupported_reason", "group_kind",
           "skipped_tokens"]

#: Version of the payload layout (docs/vllm.md); part of every namespace.
PAYLOAD_FORMAT = "kvtier-vllm-payload-v1"

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SAMPLE = 1 << 20


def weights_fingerprint(path: str | os.PathLike) -> str:
    """A cheap fingerprint of the weight files under a local model directory:
    for each file, its name, size and the SHA-256 of its first and last MiB.
    Empty when ``path`` is not a local directory."""
    root = Path(path)
    if not root.is_dir():
        return ""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)):
        size = f.stat().st_size
        h.update(f"{f.relative_to(root)}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_SAMPLE))
            if size > 2 * _SAMPLE:
                fh.seek(size - _SAMPLE)
                h.update(fh.read(_SAMPLE))
    return h.hexdigest()


def group_kind(spec) -> str:
    """What a prefix hit needs of a KV-cache group with ``spec`` (vLLM's
    ``single_type_kv_cache_manager``): ``"full"``, every block before the hit
    (full attention, MLA, and a sliding-window layer vLLM runs as full
    attention when its hybrid manager is off); ``"window"``, only the blocks
    vLLM keeps at the hit (sliding window, chunked local); ``"state"``, the
    one block holding the recurrent state at the hit (Mamba / linear
    attention in vLLM's "align" mode, where vLLM keeps states at block
    boundaries); ``""``, a kind kvtier does not cache."""
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec, SlidingWindowSpec

    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return "window"
    if isinstance(spec, FullAttentionSpec):
        return "full"
    if isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align" and not spec.num_speculative_blocks:
        return "state"
    return ""


def skipped_tokens(spec, computed: int) -> int:
    """Leading tokens of a ``computed``-token prefix that a group with ``spec``
    no longer attends to, so vLLM holds null blocks there: the same sums as
    vLLM's ``SlidingWindowManager`` / ``ChunkedLocalAttentionManager`` /
    ``MambaManager`` ``get_num_skipped_tokens`` (a unit test compares them)."""
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, MambaSpec, SlidingWindowSpec

    if isinstance(spec, MambaSpec):
        return max(0, computed - 1)  # MambaManager: only the last state is needed
    if isinstance(spec, SlidingWindowSpec):
        return max(0, computed - spec.sliding_window + 1 - getattr(spec, "extra_retained_tokens", 0))
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return computed // spec.attention_chunk_size * spec.attention_chunk_size
    return 0


def unsupported_reason(kv_cache_config) -> str:
    """Why this engine's KV cache cannot go through kvtier, or ``""``.

    Supported: any number of KV-cache groups of full attention (MLA included),
    sliding-window and chunked-local attention, and Mamba / linear-attention
    state groups in vLLM's "align" mode, all of one block size. The rest is
    named and refused (docs/vllm.md, "Hybrid models").
    """
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return "no KV-cache groups"
    sizes = {g.kv_cache_spec.block_size for g in groups}
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if not group_kind(spec):
            what = type(spec).__name__
            if "Mamba" in what:
                mode = getattr(spec, "mamba_cache_mode", None)
                if mode != "align":
                    return (f"KV-cache group {i} holds state-space (Mamba / linear-attention) layers with "
                            f"mamba_cache_mode={mode!r}: vLLM keeps no state at block boundaries to store "
                            "(turn vLLM's prefix caching on)")
                return (f"KV-cache group {i} holds state-space layers with speculative state blocks "
                        f"({spec.num_speculative_blocks}), which kvtier does not cache")
            return f"KV-cache group {i} has spec {what}, which kvtier does not cache"
        if getattr(spec, "prefix_cacheable", True) is False:
            return f"KV-cache group {i} is not prefix-cacheable ({type(spec).__name__})"
    if len(sizes) != 1:
        return f"KV-cache groups of different block sizes {sorted(sizes)}"
    return ""


def _slug(model: str) -> str:
    base = model.rstrip("/").split("/")[-1] or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)[:40]


class EngineIdentity:
    """The namespace-deciding facts of one engine, computed the same way in the
    scheduler process and in every worker (both get the same configs)."""

    def __init__(self, vllm_config, kv_cache_config, model_id: str = "", prefix: str = ""):
        mc = vllm_config.model_config
        pc = vllm_config.parallel_config
        groups = kv_cache_config.kv_cache_groups
        if model_id:
            model = {"model_id": model_id}
        else:
            model = {
                "model": mc.model,
                "revision": mc.revision,
                "weights": weights_fingerprint(mc.model),
            }
        hf = mc.hf_config.to_dict() if hasattr(mc.hf_config, "to_dict") else {}
        # Private keys ("_name_or_path", "_attn_implementation...") are set at
        # run time and differ between entry points for the same model.
        hf = {k: v for k, v in hf.items() if not k.startswith("_") and k != "transformers_version"}
        # Per group: its spec and layers (one namespace per group, below).
        self._groups: list[dict[str, Any]] = []
        for group in groups:
            facts: dict[str, Any] = {"spec": repr(group.kv_cache_spec)}
            if pc.pipeline_parallel_size == 1:
                facts["layers"] = list(group.layer_names)
            self._groups.append(facts)
        if pc.pipeline_parallel_size == 1:
            layers: dict[str, Any] = {}
        else:
            # Each PP worker's config lists only its stage's layers, and the
            # scheduler gets a copy of worker 0's (vLLM's
            # generate_scheduler_kv_cache_config): the names would give the
            # scheduler stage 0's layers for every stage. A stage's layers
            # follow from the model's config (hashed below), the PP size and
            # rank and vLLM's split (get_pp_indices: even, or this variable),
            # which every process knows alike.
            layers = {"pp_layer_partition": os.environ.get("VLLM_PP_LAYER_PARTITION")}
        self.facts: dict[str, Any] = {
            "format": PAYLOAD_FORMAT,
            **model,
            "dtype": str(mc.dtype),
            "quantization": mc.quantization,
            "hf_config": hf,
            "cache_dtype": vllm_config.cache_config.cache_dtype,
            "block_size": vllm_config.cache_config.block_size,
            **layers,
            "device": vllm_config.device_config.device_type,
            "tp": pc.tensor_parallel_size,
            "pp": pc.pipeline_parallel_size,
        }
        self.prefix = prefix
        self.slug = _slug(model_id or mc.model)
        self.block_size = vllm_config.cache_config.block_size
        self.world = [(pp, tp) for pp in range(pc.pipeline_parallel_size) for tp in range(pc.tensor_parallel_size)]

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    def namespace(self, pp_rank: int = 0, tp_rank: int = 0, group: int = 0) -> str:
        """The namespace of KV-cache ``group`` on rank (``pp_rank``, ``tp_rank``)."""
        facts = {**self.facts, **self._groups[group], "rank": [pp_rank, tp_rank]}
        if len(self._groups) > 1:
            facts["group"] = group
        blob = json.dumps(facts, sort_keys=True, default=str)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
        return f"{self.prefix}vllm/{self.slug}/{digest}"

    def namespaces(self, group: int = 0) -> list[str]:
        """Every rank's namespace of ``group`` (what the scheduler looks up)."""
        return [self.namespace(pp, tp, group) for pp, tp in self.world]
