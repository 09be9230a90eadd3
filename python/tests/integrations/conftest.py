"""Tests of the LMCache and SGLang backends run in their own venv
(.tools/lmcache: LMCache's pins conflict with vLLM's CPU build), against the
real kvtier binary (fixtures from ../conftest.py)."""
