"""The serving benchmark's parts (``scripts/bench-serving.py``, notes/*-serving):
a seeded multi-turn conversation trace (:mod:`.trace`), vLLM OpenAI servers
started as replicas (:mod:`.engines`), the router in front of them
(:mod:`.router`: round-robin, random, or prefill/decode split) and vLLM's own
benchmark client (:mod:`.client`).

Unlike the rest of :mod:`perf` (standard library only), these run in vLLM's
venv (``.tools/vllm``), which has aiohttp, transformers and vLLM itself;
docs/serving.md has the set-up.
"""
