#!/usr/bin/env bash
# The notes' re-run commands name this file: scripts/bench-data-plane.py is the driver (its docstring says what and how).
exec python3 "$(dirname "$0")/bench-data-plane.py" "$@"
