"""Rounding to the activation dtype inside Triton kernels, the same on the GPU and in Triton's CPU
interpreter (whose float -> BF16 cast truncates where the GPU rounds to nearest even)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """FP32 x rounded to `dtype` and kept in FP32: where a reference materializes a tensor in it.
    BF16 by its bits (round to nearest, ties to even), so a test on the CPU sees the GPU's values."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype).to(tl.float32)
