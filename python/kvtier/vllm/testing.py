"""Builds a small model with random weights and a tokenizer, entirely offline,
for tests and benchmarks of the vLLM connector: Llama (full attention) or one
of the hybrid layouts of :data:`ARCHS` (sliding window, Mamba2).

No model downloads exist on the machines kvtier is tested on, and a connector
test needs a real model that vLLM loads the normal way. ``make_model`` writes a
Hugging Face model directory (``config.json``, ``model.safetensors``,
tokenizer files) that ``vllm.LLM(model=path)`` loads like any other:

* the weights are random (seeded: the same seed gives the same bytes, a
  different seed gives a different model of the same shape);
* the tokenizer is a byte-level BPE trained on generated text, so any string
  tokenizes, and ``prompt_tokens`` makes prompts of an exact token length.

Random weights make the top logits near-ties, so compare float32 logprobs with
a tolerance rather than greedy tokens (``../shared/ENGINES.md``).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["ARCHS", "SIZES", "make_model", "prompt_tokens"]

#: Named shapes. ``small`` loads in seconds (tests); ``base`` is 184.6M
#: parameters, the size the TTFT benchmark uses (notes/*-vllm-ttft.md).
SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
    "base": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4),
}

#: Architectures ``make_model`` builds, each the smallest model of a KV-cache
#: layout people deploy (docs/vllm.md, "Hybrid models"):
#:
#: * ``llama``: full attention in every layer (one KV-cache group);
#: * ``mistral-sw``: sliding window (``window`` tokens) in every layer, as
#:   Mistral 7B v0.1;
#: * ``gemma3``: five sliding-window layers per global one, as Gemma 3;
#: * ``granite-hybrid``: Mamba2 layers around one attention layer, as Granite 4
#:   (GraniteMoeHybrid; vLLM's CPU build runs it in float32).
ARCHS = ("llama", "mistral-sw", "gemma3", "granite-hybrid")


def _config(arch: str, size: str, window: int, layers: int | None, common: dict):
    """The Hugging Face config and model class of ``arch``."""
    import transformers as tf

    shape = dict(SIZES[size])
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if arch == "llama":
        return tf.LlamaConfig(**common, **shape), tf.LlamaForCausalLM
    if arch == "mistral-sw":
        return tf.MistralConfig(**common, **shape, sliding_window=window), tf.MistralForCausalLM
    n = max(shape["num_hidden_layers"], 6)
    shape["num_hidden_layers"] = n
    if arch == "gemma3":
        # Every sixth layer global, the rest local: Gemma 3's pattern.
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
        head_dim = shape["hidden_size"] // shape["num_attention_heads"]
        return tf.Gemma3TextConfig(**common, **shape, head_dim=head_dim, sliding_window=window,
                                   layer_types=types), tf.Gemma3ForCausalLM
    if arch == "granite-hybrid":
        # One attention layer in the middle, Mamba2 everywhere else (Granite 4).
        types = ["attention" if i == n // 2 else "mamba" for i in range(n)]
        return tf.GraniteMoeHybridConfig(
            **common, **shape, layer_types=types, num_local_experts=0, shared_intermediate_size=shape["intermediate_size"],
            mamba_n_heads=8, mamba_d_head=shape["hidden_size"] * 2 // 8, mamba_d_state=16, mamba_n_groups=1,
            mamba_chunk_size=64, position_embedding_type="rope"), tf.GraniteMoeHybridForCausalLM
    raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def _corpus(n_lines: int, seed: int) -> list[str]:
    """Lines of random letter strings: enough distinct pairs for BPE to learn
    a vocabulary of a few thousand merges."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 24))) for _ in range(n_lines)]


def make_model(
    path: str | Path,
    size: str = "small",
    seed: int = 0,
    vocab_size: int = 2048,
    max_position_embeddings: int = 20480,
    dtype: str = "float32",
    arch: str = "llama",
    window: int = 256,
    layers: int | None = None,
) -> Path:
    """Writes a random-weight model and its tokenizer to ``path`` and returns it.

    ``seed`` picks the weights; ``size`` one of :data:`SIZES`; ``arch`` one of
    :data:`ARCHS` (hybrid layouts get at least 6 layers), ``window`` the
    sliding window of the ``-sw``/``gemma3`` ones, ``layers`` a layer count
    other than the size's. Idempotent: an existing
    directory with the same parameters is reused.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    params = {"size": size, "seed": seed, "vocab_size": vocab_size, "max_pos": max_position_embeddings, "dtype": dtype}
    if arch != "llama":  # (the stamp of a Llama model keeps its old form)
        params.update(arch=arch, window=window)
    if layers is not None:
        params["layers"] = layers
    stamp = path / "kvtier-testmodel.json"
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return path
    path.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, seed=1234), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if len(fast) != vocab_size:
        raise RuntimeError(f"the tokenizer learned {len(fast)} tokens, not {vocab_size}")
    fast.model_max_length = max_position_embeddings
    fast.save_pretrained(path)

    cfg, model_cls = _config(arch, size, window, layers, dict(
        vocab_size=len(fast),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype=dtype,
        tie_word_embeddings=False,
    ))
    torch.manual_seed(seed)
    model = model_cls(cfg).to(getattr(torch, dtype))
    model.save_pretrained(path, safe_serialization=True)
    stamp.write_text(json.dumps(params))
    return path


def prompt_tokens(n: int, seed: int = 0, vocab_size: int = 2048, first: int = 2) -> list[int]:
    """``n`` pseudo-random token ids in ``[first, vocab_size)`` (ids below
    ``first`` are the special tokens), reproducible from ``seed``."""
    rng = random.Random(seed)
    return [rng.randrange(first, vocab_size) for _ in range(n)]
