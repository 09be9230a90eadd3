"""Asks Linux for the AMX tile state before vLLM's CPU attention needs it.

vLLM 0.32's CPU build computes bf16 attention with AMX tile instructions
(``cpu_attention_with_kv_cache``) without asking the kernel for the tile
state first (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, which
Linux requires before a process may touch AMX). oneDNN asks on its own, so an
engine whose first forward pass is a whole prefill never notices; an engine
whose first forward pass is a single token dies with SIGILL. A load from
kvtier makes exactly that likely: a fresh engine whose first prompt is cached
but for its last token (notes/065-cold-tiers.md, "FP8's quality"). The
permission is per process, so the connector's worker side asks once.
"""
from __future__ import annotations

import ctypes
import platform
import sys

#: <asm/prctl.h> and <asm/unistd_64.h>.
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_amx() -> bool:
    """True if this process may use AMX tiles now (it asked, and Linux said
    yes); False on other CPUs or systems, where nothing is needed."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False
