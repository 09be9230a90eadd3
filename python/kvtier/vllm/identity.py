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
* **the payload format version** of this connector.

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

__all__ = ["PAYLOAD_FORMAT", "EngineIdentity", "weights_fingerprint", "unsupported_reason"]

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


def unsupported_reason(kv_cache_config) -> str:
    """Why this engine's KV cache cannot go through kvtier, or ``""``.

    Supported: one KV-cache group of full attention (MLA included). Hybrid
    models (sliding window, Mamba, several groups) would need per-group
    payloads and are left out.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return f"{len(groups)} KV-cache groups (hybrid model); only one full-attention group is supported"
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec):
        return f"KV-cache spec {type(spec).__name__} is not full attention"
    if spec.sliding_window is not None or spec.attention_chunk_size is not None:
        return "sliding-window or chunked-local attention layers"
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
        group = kv_cache_config.kv_cache_groups[0]
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
        if pc.pipeline_parallel_size == 1:
            layers: dict[str, Any] = {"layers": list(group.layer_names)}
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
            "spec": repr(group.kv_cache_spec),
            **layers,
            "device": vllm_config.device_config.device_type,
            "tp": pc.tensor_parallel_size,
            "pp": pc.pipeline_parallel_size,
        }
        self.prefix = prefix
        self.slug = _slug(model_id or mc.model)
        self.block_size = vllm_config.cache_config.block_size
        self.world = [(pp, tp) for pp in range(pc.pipeline_parallel_size) for tp in range(pc.tensor_parallel_size)]

    def namespace(self, pp_rank: int = 0, tp_rank: int = 0) -> str:
        """The namespace of rank (``pp_rank``, ``tp_rank``)."""
        blob = json.dumps({**self.facts, "rank": [pp_rank, tp_rank]}, sort_keys=True, default=str)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:20]
        return f"{self.prefix}vllm/{self.slug}/{digest}"

    def namespaces(self) -> list[str]:
        """Every rank's namespace (what the scheduler looks up)."""
        return [self.namespace(pp, tp) for pp, tp in self.world]
