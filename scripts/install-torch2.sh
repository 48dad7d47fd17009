#!/usr/bin/env bash
# Optional: installs a current PyTorch 2.x from PyPI into `python3` (the pyenv interpreter, not
# Debian's /usr/bin/python3 which keeps torch 1.13). Several GB with its CUDA libraries, so CI does
# not run this; tests and benchmarks that want torch 2.x skip with a message when it is absent.
set -euo pipefail
py=${PYTHON2X:-python3}
# expecttest and pytest: PyTorch's own launcher tests (tests/torchrun_compat) import them.
if "$py" -c 'import torch, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
  echo "install-torch2: $("$py" -c 'import torch; print(torch.__version__)') already in $py"
  "$py" -m pip install --quiet expecttest pytest
  exit 0
fi
"$py" -m pip install --quiet torch numpy expecttest pytest
"$py" -c 'import torch; print("install-torch2: torch", torch.__version__, "in", __import__("sys").executable)'
