#!/usr/bin/env bash
# Create .venv and install regate with everything its tests need. Idempotent; safe to re-run.
# torch: the CPU build (CI has no GPU). Where this machine carries a local CPU wheel, pip takes it;
# elsewhere we ask PyTorch's CPU index so a fresh box does not download a multi-GB CUDA build.
# Each step says what it does before it starts (pip itself stays quiet: a first install takes minutes).
#   scripts/setup.sh             set up
#   scripts/setup.sh --dry-run   print the steps and the commands, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "setup: error: unknown argument '$1' (expected --dry-run or nothing)" >&2; exit 2 ;;
esac
step() { echo "setup: $*"; }
run() { if [ "$DRY" = 1 ]; then echo "  would run: $*"; else "$@"; fi; }
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ -x .venv/bin/python ]; then
  step "1/4 .venv exists: $(pwd)/.venv"
else
  step "1/4 creating .venv with $PY"
  run "$PY" -m venv .venv
fi
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then
  step "2/4 torch already installed"
elif ls /opt/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
  version=$(ls /opt/wheels/torch-*+cpu-*.whl | head -1 | sed -E 's/.*torch-([0-9.]+)\+cpu.*/\1/')
  step "2/4 installing torch $version (CPU build, this machine's local wheel; a minute or two)"
  run "${pip[@]}" "torch==$version"
else
  step "2/4 installing torch (CPU build from PyTorch's CPU index, a few hundred MB; a few minutes)"
  run "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu
fi
# compat: a .pth path entry, not an import hook, so a head's tree on PYTHONPATH never silently
# borrows a module it lacks from this checkout (the hook answers for any missing submodule).
step "3/4 installing regate and its dependencies (ray, transformers, ...; pip install -e '.[test]')"
run "${pip[@]}" -e '.[test]' --config-settings editable_mode=compat
# bubblewrap: the sandbox every process of a gated head runs in (orchestrator/box/sandbox.py). Without it
# a root box falls back to running the head as `nobody`; a box that can do neither refuses to gate.
if command -v bwrap >/dev/null 2>&1; then
  step "4/4 bubblewrap already installed ($(bwrap --version))"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  step "4/4 installing bubblewrap (Debian's package) for the gate's sandbox"
  run sh -c 'apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)' \
    || step "4/4 bubblewrap could not be installed: gates fall back to the reaper (as root) or refuse"
else
  step "4/4 bubblewrap is not installed: install it (apt-get install bubblewrap) for the gate's sandbox"
fi
if [ "$DRY" = 1 ]; then step "dry run: nothing was installed"
else step "done in ${SECONDS} s: regate installed in $(pwd)/.venv"; fi
