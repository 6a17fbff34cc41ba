#!/usr/bin/env bash
# Create .venv and install regate with everything its tests need. Idempotent; safe to re-run.
# torch: the CPU build (CI has no GPU). Where this machine carries a local CPU wheel, pip takes it;
# elsewhere we ask PyTorch's CPU index so a fresh box does not download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if ls /opt/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
    "${pip[@]}" "torch==$(ls /opt/wheels/torch-*+cpu-*.whl | head -1 | sed -E 's/.*torch-([0-9.]+)\+cpu.*/\1/')"
  else
    "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
# compat: a .pth path entry, not an import hook, so a head's tree on PYTHONPATH never silently
# borrows a module it lacks from this checkout (the hook answers for any missing submodule).
"${pip[@]}" -e '.[test]' --config-settings editable_mode=compat
echo "regate installed in $(pwd)/.venv"
