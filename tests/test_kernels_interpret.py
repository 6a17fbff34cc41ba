"""The Triton kernels themselves, run by Triton's CPU interpreter against the torch reference.

Runs where Triton is installed (skips otherwise; Triton is not a hard dependency). The interpreter
must be chosen before Triton decorates the kernels, so each case runs in a fresh subprocess.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
# Triton 3.6's interpreter calls int() on 1-element arrays, which numpy >= 2.4 refuses: index by item.
_SCRIPT = """
import json, sys
import triton.runtime.interpreter as ti
_orig = ti._patch_lang_tensor
def _patched(tensor, scope):
    _orig(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
ti._patch_lang_tensor = _patched
from kernels.nvfp4_gemm import check
ms, n, k, seed = json.loads(sys.argv[1])
print(json.dumps(check(ms=tuple(ms), n=n, k=k, device="cpu", seed=seed)))
"""


def _run(ms, n, k, seed):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps([ms, n, k, seed])], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return {int(m): e for m, e in json.loads(out.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("ms,n,k", [
    ([1, 2, 3, 16, 17, 64, 256], 77, 256),  # every table row, ragged N
    ([1, 4, 16], 100, 1024),  # split-K (few N tiles, four K tiles)
    ([1, 17], 40, 16 * 7),  # K a multiple of 16 but not 32: the masked K tail
])
def test_interpreted_kernel_matches_reference(ms, n, k):
    errs = _run(ms, n, k, seed=int.from_bytes(os.urandom(2), "little"))
    assert set(errs) == set(ms)
    assert all(e <= 1e-2 for e in errs.values()), errs
