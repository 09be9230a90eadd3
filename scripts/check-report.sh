#!/usr/bin/env bash
# Opens a kvtier bench report.html in headless Chromium and checks that every
# chart rendered: the dumped DOM's <body> must have data-charts-rendered equal
# to data-charts-expected, data-chart-errors="0", and the browser log must show
# no uncaught JavaScript error. Optional: SCREENSHOT=out.png also saves a picture.
# Usage: scripts/check-report.sh REPORT.html
set -euo pipefail
report="$(realpath "${1:?usage: scripts/check-report.sh REPORT.html}")"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$browser" ] || { echo "check-report: chromium is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
profile="$(mktemp -d)"
log="$(mktemp)"
trap 'rm -rf "$profile" "$log"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --disable-dev-shm-usage --user-data-dir="$profile"
       --virtual-time-budget=5000 --enable-logging=stderr --v=0)
dom="$(timeout 60 "$browser" "${flags[@]}" --dump-dom "file://$report" 2>"$log")"
# DOM_OUT=FILE keeps the rendered DOM for further checks.
if [ -n "${DOM_OUT:-}" ]; then printf '%s' "$dom" > "$DOM_OUT"; fi
body="$(grep -o '<body[^>]*>' <<<"$dom" | head -1)"
attr() { sed -n "s/.*$1=\"\([^\"]*\)\".*/\1/p" <<<"$body"; }
expected="$(attr data-charts-expected)"
rendered="$(attr data-charts-rendered)"
errors="$(attr data-chart-errors)"
fail=0
if [ -z "$expected" ] || [ "$rendered" != "$expected" ]; then
  echo "check-report: charts rendered ${rendered:-none} of ${expected:-?}" >&2; fail=1
fi
if [ "${errors:-0}" != "0" ]; then echo "check-report: $errors chart(s) failed" >&2; fail=1; fi
if grep -E 'Uncaught|CONSOLE\(.*\)\].*(Error|error)' "$log" >&2; then
  echo "check-report: JavaScript errors in the browser log (above)" >&2; fail=1
fi
if [ -n "${SCREENSHOT:-}" ]; then
  timeout 60 "$browser" "${flags[@]}" --hide-scrollbars --window-size=1400,3000 \
    --screenshot="$(realpath -m "$SCREENSHOT")" "file://$report" 2>/dev/null || true
fi
[ "$fail" = 0 ] && echo "check-report: ok ($rendered/$expected charts, no errors)"
exit "$fail"
