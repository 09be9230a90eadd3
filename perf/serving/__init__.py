"""The serving benchmark's parts (``scripts/bench-serving.py``, notes/*-serving):
a seeded multi-turn conversation trace (:mod:`.trace`), vLLM OpenAI servers
started as replicas (:mod:`.engines`), the router in front of them
(:mod:`.router`: round-robin, random, prefill/decode split, or cache-aware:
:mod:`.router_index`, :mod:`.router_score`, :mod:`.router_events`) and vLLM's
own benchmark client (:mod:`.client`); the routing benchmark's topology, two
replicas each with its own kvtier node (:mod:`.routing`).

Unlike the rest of :mod:`perf` (standard library only), these run in vLLM's
venv (``.tools/vllm``), which has aiohttp, transformers and vLLM itself;
docs/serving.md has the set-up.
"""
