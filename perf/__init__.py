"""kvtier's measurement library: the header every perf record carries,
/proc sampling of a process, alternating repeats with medians and outliers,
and (in :mod:`perf.services`) starting the systems a measurement runs
against. perf/README.md says how scripts use it."""
from __future__ import annotations

from .ab import Summary, alternate, median, median_or_none, order, ratio, summarize
from .header import (
    HEADER_KEYS,
    ROOT,
    command_line,
    git_state,
    header,
    machine,
    packages,
    record,
    stamp,
    stamp_file,
    tool_version,
    versions,
    write_record,
)
from .sample import Sampler, cpu_seconds, rss_mib

__all__ = [
    "HEADER_KEYS", "ROOT", "Sampler", "Summary", "alternate", "command_line", "cpu_seconds", "git_state", "header",
    "machine", "median", "median_or_none", "order", "packages", "ratio", "record", "rss_mib", "stamp", "stamp_file", "summarize", "tool_version",
    "versions", "write_record",
]
