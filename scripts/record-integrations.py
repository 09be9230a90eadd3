#!/usr/bin/env python3
"""Runs the LMCache and SGLang backend tests (CPU) and writes what ran, where,
with which versions and how long each took, as a perf record:
notes/010-lmcache-sglang.json.

    .tools/lmcache/bin/python scripts/record-integrations.py [--out notes/010-lmcache-sglang.json]

Needs scripts/setup-lmcache.sh and a built kvtier (cargo build -p kvtier).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import version

from _perf import ROOT

from perf import header, versions, write_record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="notes/010-lmcache-sglang.json")
    args = ap.parse_args()
    head = header(versions=versions(known={"lmcache": version("lmcache"), "sglang": version("sglang"),
                                           "torch": version("torch")}))
    xml = ROOT / "out" / "integrations-junit.xml"
    xml.parent.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "python/tests/integrations", f"--junitxml={xml}"],
                       cwd=ROOT, capture_output=True, text=True)
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "seconds": float(case.get("time", 0)),
                      "outcome": "failed" if failed else ("skipped" if case.find("skipped") is not None else "passed")})
    record = write_record(ROOT / args.out, {
        "note": "010-lmcache-sglang",
        "ran_on": "CPU only: LMCache's standalone engine with its mock GPU connector; SGLang's storage "
                  "interface with host pools laid out as its MHA host pool. No GPU run.",
        "pytest_exit": r.returncode,
        "tests": tests,
        "passed": sum(t["outcome"] == "passed" for t in tests),
        "failed": sum(t["outcome"] == "failed" for t in tests),
    }, head)
    print(json.dumps({k: record[k] for k in ("passed", "failed", "pytest_exit")}))
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
