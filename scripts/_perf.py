"""Makes the measurement library importable from the scripts here, which run
as ``python3 scripts/NAME.py`` (so only scripts/ is on ``sys.path``): the
repository root, for ``perf``, and python/, for the SDK (``kvtier``).

A script imports it before either::

    from _perf import ROOT

    from kvtier import Client
    from perf import write_record

perf/README.md says why a shim and not ``python3 -m``: every note's re-run
command names ``scripts/NAME.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path

#: The repository root.
ROOT = Path(__file__).resolve().parent.parent

for _p in (ROOT / "python", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
