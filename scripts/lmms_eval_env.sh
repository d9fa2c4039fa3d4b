#!/usr/bin/env bash
# Build a separate virtualenv holding lmms-eval beside paravt (editable), for `python -m lmms_eval
# --model paravt` and the opt-in tests in tests/test_lmms_eval.py.
#
#   make lmms-eval-env                     # or: scripts/lmms_eval_env.sh [VENV_DIR]  (default .venv-lmms)
#   .venv-lmms/bin/python -m lmms_eval --model paravt --model_args model=URL,frames=64 --tasks videomme ...
#   .venv-lmms/bin/python -m pytest -m lmms_eval tests/test_lmms_eval.py
#
# Why a separate virtualenv and these steps:
# - lmms-eval caps PyAV below 16 (paravt's own .venv has 18.x); paravt's video code runs on 15.1.
# - lmms-eval requires torchvision, and the registry's torchvision wheels are built against the CUDA
#   build of torch: beside a CPU build of torch their compiled ops do not load, and `import
#   lmms_eval.tasks` fails ("operator torchvision::nms does not exist"). lmms-eval's core and the
#   video tasks paravt is run on do not use torchvision, so where it does not import it is removed.
#   Beside a CUDA build of torch it imports and stays.
set -euo pipefail
VENV=${1:-.venv-lmms}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch>=2.6,<=2.13.0}
cd "$(dirname "$0")/.."
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
# Not paravt's [test] extra: it holds mcp 2.x (paravt mcp's SDK), and lmms-eval 0.7.3's MCP client is
# written against mcp 1.x (timedelta timeouts, camelCase fields). This env keeps mcp 1.x; the server its
# `mcp_server_path` starts runs under paravt's own Python (`paravt mcp --write-script`).
"$VENV/bin/python" -m pip install -q -e ".[lmms-eval]" "mcp>=1.20,<2" "pytest>=8" "pytest-timeout>=2.3" \
  "pytest-xdist>=3.8" "hypothesis>=6.100"
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
  echo "torchvision does not load beside this torch build: removing it (lmms-eval's video tasks do not need it)"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision
fi
"$VENV/bin/python" - <<'PY'
import av, lmms_eval, torch
import lmms_eval.tasks  # noqa: F401  (fails when torchvision is broken)
from importlib.metadata import version
from lmms_eval.models import get_model
assert get_model("paravt").__name__ == "ParaVT"
print(f"lmms-eval {version('lmms_eval')}, paravt {version('paravt')}, torch {torch.__version__}, PyAV {av.__version__}: "
      "`--model paravt` resolves")
PY
