"""Session-wide test setup.

Without a GPU, Triton kernels can run only under Triton's CPU interpreter, and the interpreter must
be on before `triton.language` is first imported anywhere (transformers imports it too): set here,
before any test module loads, so tests/test_fused_decode.py checks the kernels' maths in CI.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
