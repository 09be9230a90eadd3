#!/usr/bin/env python3
"""Runs the LMCache and SGLang backend tests (CPU) and writes what ran, where,
with which versions and how long each took, as a perf record:
notes/010-lmcache-sglang.json.

    .tools/lmcache/bin/python scripts/record-integrations.py [--out notes/010-lmcache-sglang.json]

Needs scripts/setup-lmcache.sh and a built kvtier (cargo build -p kvtier).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="notes/010-lmcache-sglang.json")
    args = ap.parse_args()
    xml = ROOT / "out" / "integrations-junit.xml"
    xml.parent.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "python/tests/integrations", f"--junitxml={xml}"],
                       cwd=ROOT, capture_output=True, text=True)
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "seconds": float(case.get("time", 0)),
                      "outcome": "failed" if failed else ("skipped" if case.find("skipped") is not None else "passed")})
    record = {
        "note": "010-lmcache-sglang",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.platform()}; {os.cpu_count()} CPUs; no GPU",
        "command": ".tools/lmcache/bin/python scripts/record-integrations.py",
        "versions": {"lmcache": version("lmcache"), "sglang": version("sglang"), "torch": version("torch"),
                     "python": platform.python_version()},
        "ran_on": "CPU only: LMCache's standalone engine with its mock GPU connector; SGLang's storage "
                  "interface with host pools laid out as its MHA host pool. No GPU run.",
        "pytest_exit": r.returncode,
        "tests": tests,
        "passed": sum(t["outcome"] == "passed" for t in tests),
        "failed": sum(t["outcome"] == "failed" for t in tests),
    }
    out = ROOT / args.out
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: record[k] for k in ("passed", "failed", "pytest_exit")}))
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
