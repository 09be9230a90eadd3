#!/usr/bin/env bash
# notes/007's re-run command names this file: scripts/bench-allocator.py is the driver (its docstring says what and how).
exec python3 "$(dirname "$0")/bench-allocator.py" "$@"
