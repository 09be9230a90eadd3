"""vLLM's own benchmark client, ``vllm bench serve``, run from its module.

``python -m perf.serving.client ARGS`` is ``vllm bench serve ARGS``: the same
argument parser (``vllm.benchmarks.serve.add_cli_args``) and the same
``main``. The console script cannot start on vLLM's CPU wheel (it asks for
the version of a distribution named ``vllm``; see :mod:`.engines`).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    parser = argparse.ArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
