#!/usr/bin/env bash
# The network lab (notes/015): client and server in two network namespaces
# joined by a user-space delay line with a configurable RTT and rate.
#   scripts/netlab.sh --rtt 0,10,30,150,550 --streams 1,4,16 [--rate 16mbit] [--duration 10s] --out DIR
# Needs root. See scripts/netlab.py for the method and the validation.
set -euo pipefail
exec python3 "$(dirname "$0")/netlab.py" "$@"
