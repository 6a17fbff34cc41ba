"""Packed NVFP4 W4A16 GEMM: y[M, N] = x[M, K] @ dequant(W)^T, BF16 out, FP32 accumulate.

Two kernels, one contract:
- the CUDA GEMMs on the tile layout (`kernels/tile_gemm.py`, csrc/: mma.sync for M <= 8, Hopper
  wgmma above): `prepare` repacks W once into the tile layout (`kernels/tile_layout.py`; exactly
  the checkpoint's bytes) and `matmul` runs them at every M. The fast path.
- the Triton kernels (`kernels/nvfp4_triton.py`) on the checkpoint layout (`Nvfp4Weight.packed` u8
  [N, K/2], low nibble first; `block_scale` E4M3 [N, K/16]; `global_scale` FP32, ModelOpt
  convention: multiply): weights the tile layout cannot hold (K not a multiple of 256), the N % 16
  tail rows (which the tile operand carries in this layout), and every weight when the extension
  cannot be built (the option tile_gemm=0 forces this). Where `prepare` built a tile operand it releases
  the checkpoint layout (`Nvfp4Weight.release_checkpoint_layout`): the device keeps the packed bytes
  once, and `Nvfp4Weight.checkpoint_layout()` rebuilds them from the operand on demand.

Each kernel's algorithm per M comes from a fixed table (`kernels/table.py`: TILE, TRITON);
nothing is autotuned at call time. Every call allocates through torch's
caching allocator, passes the global scale by value and never syncs the host, so it records into
a CUDA graph.

This module reads top to bottom: backend contract (`available`, `prepare`, `matmul`), torch
reference (`reference_gemm`, `decode_e2m1_bits`, `decode_e4m3_bits`), check. The Triton launcher
`nvfp4_gemm` is kernels/triton_gemm.py's, re-exported here.
Triton is imported lazily: on a machine without it the module still imports and `available()`
says why not.
"""
from __future__ import annotations

import functools

import torch

from nvfp4 import BLOCK, Nvfp4Weight, dequantize_raw
from kernels import table
from kernels.policy import DEFAULT, KernelPolicy
from kernels.triton_gemm import check_weight, nvfp4_gemm, permute_x_for_mma, sm_count

SM90 = (9, 0)
__all__ = ["available", "tile_available", "prepare", "matmul", "merge", "matmul_merged", "nvfp4_gemm", "permute_x_for_mma", "reference_gemm",
           "check"]


# ---------------------------------------------------------------- backend contract

@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "sm_90") when the kernel can run here, else (False, why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "no Triton"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != SM90:
        return False, f"sm_{major}{minor}, the kernel is tuned and checked for sm_90 only"
    return True, "sm_90"


@functools.lru_cache(maxsize=1)
def tile_available() -> tuple[bool, str]:
    """(True, "sm_90") when the CUDA tile GEMM is built and usable here, else (False, why not)."""
    ok, why = available()
    if not ok:
        return ok, why
    from kernels import tile_gemm

    try:
        tile_gemm.extension()
    except Exception as e:  # nvcc/ninja missing or a compile error: the Triton path still serves
        return False, f"tile GEMM extension did not build: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return True, "sm_90"


def prepare(w: Nvfp4Weight, policy: KernelPolicy = DEFAULT) -> None:
    """Once at load: check the operand, repack it for the tile GEMM where it can (and `policy.tile_gemm`
    allows), warm the kernels."""
    check_weight(w.packed, w.block_scale, w.name)
    from kernels import tile_layout

    op = None
    if policy.tile_gemm and tile_available()[0] and tile_layout.supported(w.out_features, w.in_features) is None:
        op = tile_layout.repack(w.packed, w.block_scale, w.name)
    w.kernel_operand, w.kernel_operand_bytes = op, (op.nbytes if op is not None else 0)
    _warm(w.out_features, w.in_features, w.packed.device)
    if op is not None:
        _warm_tile(op, policy=policy)
        w.release_checkpoint_layout()  # the operand holds the same bytes: keep them once


def matmul(x: torch.Tensor, w: Nvfp4Weight, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """x bf16 [M, K] (or [..., K]) -> bf16 [M, N] (or [..., N])."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    from kernels import tile_gemm

    if w.kernel_operand is not None:  # every M; the checkpoint layout is released
        y = tile_gemm.tile_gemm(x2, w.kernel_operand, w.global_scale, sms=sm_count(x.device), policy=policy)
    else:
        y = nvfp4_gemm(x2, w.packed, w.block_scale, w.global_scale, name=w.name)
    return y.reshape(*lead, w.out_features)


def matmul_split(x: torch.Tensor, w: Nvfp4Weight, policy: KernelPolicy = DEFAULT):
    """x bf16 [M, K] -> bf16 [M, N], or, where the tile GEMM splits K, its unsummed partials
    (kernels.tile_gemm.SplitSum) for a consumer that sums them as it reads them (add_rms_norm)."""
    from kernels import tile_gemm

    if w.kernel_operand is None or x.dim() != 2:
        return matmul(x, w, policy)
    return tile_gemm.tile_gemm(x, w.kernel_operand, w.global_scale, sms=sm_count(x.device), defer_sum=True,
                               policy=policy)


def merge(ws: list[Nvfp4Weight], policy: KernelPolicy = DEFAULT):
    """Weights of one input (each prepared) as one operand for `matmul_merged`, or None when they
    cannot share one (kernels/merge.py says when)."""
    from kernels import merge as merging

    m = merging.merge(ws)
    if m is not None:
        _warm_tile(m.op, m.row_scale, policy)
    return m


def matmul_merged(x: torch.Tensor, m, policy: KernelPolicy = DEFAULT) -> torch.Tensor:
    """x bf16 [M, K] -> bf16 [M, sum of the members' N], the members' outputs side by side."""
    from kernels import merge as merging

    return merging.matmul_merged(x, m, policy)


def _warm_tile(op, row_scale=None, policy: KernelPolicy = DEFAULT) -> None:
    """One call per table row and, where some M takes it, the dequant path's kernel compiled, so nothing
    loads or allocates lazily during a CUDA-graph capture."""
    from kernels import tile_gemm

    if table.dequant_from(1 << 30, op.n, op.k, policy):  # the dequant path's Triton kernel, on one row tile
        from kernels.tile_dequant import dequantize_tile
        from kernels.tile_layout import TileOperand

        one = TileOperand(op.words[:1], op.codes[:1], op.tail_packed[:0], op.tail_scale[:0], 16, op.k)
        dequantize_tile(one, 1.0, row_scale[:16] if row_scale is not None else None)
    for max_m, _ in table.TILE:
        m = min(max_m, 256)
        tile_gemm.tile_gemm(torch.zeros(m, op.k, dtype=torch.bfloat16, device=op.words.device), op, 1.0,
                            sms=sm_count(op.words.device), row_scale=row_scale, policy=policy)


@functools.lru_cache(maxsize=None)
def _warm(n: int, k: int, device: torch.device) -> None:
    """Run each table row once for (N, K) so Triton compiles before any CUDA-graph capture."""
    packed = torch.zeros(n, k // 2, dtype=torch.uint8, device=device)
    scale = torch.zeros(n, k // BLOCK, dtype=torch.uint8, device=device)
    for max_m, _ in table.TRITON:
        m = min(max_m, 256)
        nvfp4_gemm(torch.zeros(m, k, dtype=torch.bfloat16, device=device), packed, scale, 1.0)


# ---------------------------------------------------------------- torch reference

def reference_gemm(x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor,
                   global_scale: float) -> torch.Tensor:
    """The twin: dequantize in FP32, matmul in FP64, one cast to BF16 at the end."""
    w = dequantize_raw(packed, block_scale, global_scale, torch.float32)
    return (x.double() @ w.double().T).to(torch.bfloat16)


def decode_e2m1_bits(packed: torch.Tensor) -> torch.Tensor:
    """The kernel's nibble trick in torch: u8 [..., K/2] -> FP32 [..., K] (e2m1 values, unscaled)."""
    b = packed.to(torch.int32)
    lo = ((b & 0x7) << 9) | ((b & 0x8) << 12)
    hi = ((b & 0x70) << 5) | ((b & 0x80) << 8)
    both = torch.stack((lo, hi), dim=-1).flatten(-2).to(torch.int16)
    return both.view(torch.float16).float() * 2.0**14


def decode_e4m3_bits(scale_bytes: torch.Tensor) -> torch.Tensor:
    """The kernel's E4M3 trick in torch: u8 -> FP32 (0x7F/0xFF, E4M3's NaN, is not a valid scale)."""
    b = scale_bytes.to(torch.int32)
    h = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(torch.int16)
    return h.view(torch.float16).float() * 2.0**8


# ---------------------------------------------------------------- check

def random_weight(n: int, k: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(packed, block_scale, global_scale) from ModelOpt's quantizer on a random Gaussian W."""
    from nvfp4 import quantize

    g = torch.Generator(device="cpu").manual_seed(seed)
    q = quantize(torch.randn(n, k, generator=g) * 0.02)
    return q.packed.to(device), q.block_scale.to(device), q.global_scale


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Frobenius-norm relative error, in FP64."""
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def check(ms=(1, 2, 3, 16, 17, 64, 256), n: int = 1000, k: int = 512, device="cuda", seed: int = 0,
          kernel: str = "triton", weight=None) -> dict:
    """A kernel ("triton" or "tile") vs the reference at each M on fresh inputs; the output is
    poisoned (NaN) before each run so unwritten elements are caught. `weight`: (packed, scale, gs)."""
    packed, scale, gs = weight or random_weight(n, k, device, seed)
    n, k = packed.shape[0], packed.shape[1] * 2
    if kernel == "tile":
        from kernels.tile_gemm import tile_gemm
        from kernels.tile_layout import repack

        op = repack(packed, scale, "check")
        run = lambda x, out: tile_gemm(x, op, gs, out=out, sms=sm_count(x.device))  # noqa: E731
    elif kernel == "triton":
        run = lambda x, out: nvfp4_gemm(x, packed, scale, gs, out=out)  # noqa: E731
    else:
        raise ValueError(f"check: kernel must be 'triton' or 'tile', found {kernel!r}")
    errs = {}
    for m in ms:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + m)).to(device, torch.bfloat16)
        y = run(x, torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device))
        if not torch.isfinite(y).all():
            raise AssertionError(f"check: non-finite output at M={m}")
        errs[m] = relative_error(y, reference_gemm(x, packed, scale, gs))
    return errs


if __name__ == "__main__":
    print(check())
