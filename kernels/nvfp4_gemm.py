"""Packed NVFP4 W4A16 GEMM: y[M, N] = x[M, K] @ dequant(W)^T, BF16 out, FP32 accumulate.

Two kernels, one contract:
- the CUDA GEMMs on the tile layout (`kernels/tile_gemm.py`, csrc/: mma.sync for M <= 8, Hopper
  wgmma above): `prepare` repacks W once into the tile layout (`kernels/tile_layout.py`; exactly
  the checkpoint's bytes) and `matmul` runs them at every M. The fast path.
- the Triton kernels (`kernels/nvfp4_triton.py`) on the checkpoint layout (`Nvfp4Weight.packed` u8
  [N, K/2], low nibble first; `block_scale` E4M3 [N, K/16]; `global_scale` FP32, ModelOpt
  convention: multiply): weights the tile layout cannot hold (K not a multiple of 256), the N % 16
  tail rows (which the tile operand carries in this layout), and every weight when the extension
  cannot be built (REGATE_TILE_GEMM=0 forces this). Where `prepare` built a tile operand it releases
  the checkpoint layout (`Nvfp4Weight.release_checkpoint_layout`): the device keeps the packed bytes
  once, and `Nvfp4Weight.checkpoint_layout()` rebuilds them from the operand on demand.

Each kernel's algorithm per M comes from a fixed table (`kernels/tuning.py`, `tile_gemm.TABLE`);
nothing is autotuned at call time. Every call allocates through torch's
caching allocator, passes the global scale by value and never syncs the host, so it records into
a CUDA graph.

This module reads top to bottom: backend contract (`available`, `prepare`, `matmul`), launcher
(`nvfp4_gemm`), torch reference (`reference_gemm`, `decode_e2m1_bits`, `decode_e4m3_bits`), check.
Triton is imported lazily: on a machine without it the module still imports and `available()`
says why not.
"""
from __future__ import annotations

import functools
import os

import torch

from engine.nvfp4 import BLOCK, Nvfp4Weight, dequantize_raw
from kernels import tuning

SM90 = (9, 0)
_OUT_SCALE_SHIFT = 2.0**22  # the 2^-14 of the E2M1 trick times the 2^-8 of the E4M3 trick


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
    if os.environ.get("REGATE_TILE_GEMM", "1") == "0":
        return False, "REGATE_TILE_GEMM=0"
    from kernels import tile_gemm

    try:
        tile_gemm.extension()
    except Exception as e:  # nvcc/ninja missing or a compile error: the Triton path still serves
        return False, f"tile GEMM extension did not build: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return True, "sm_90"


def prepare(w: Nvfp4Weight) -> None:
    """Once at load: check the operand, repack it for the tile GEMM where it can, warm the kernels."""
    _check_weight(w.packed, w.block_scale, w.name)
    from kernels import tile_layout

    op = None
    if tile_available()[0] and tile_layout.supported(w.out_features, w.in_features) is None:
        op = tile_layout.repack(w.packed, w.block_scale, w.name)
    w.kernel_operand, w.kernel_operand_bytes = op, (op.nbytes if op is not None else 0)
    _warm(w.out_features, w.in_features, w.packed.device)
    if op is not None:
        _warm_tile(op)
        w.release_checkpoint_layout()  # the operand holds the same bytes: keep them once


def matmul(x: torch.Tensor, w: Nvfp4Weight) -> torch.Tensor:
    """x bf16 [M, K] (or [..., K]) -> bf16 [M, N] (or [..., N])."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    from kernels import tile_gemm

    if w.kernel_operand is not None:  # every M; the checkpoint layout is released
        y = tile_gemm.tile_gemm(x2, w.kernel_operand, w.global_scale, sms=_sm_count(x.device))
    else:
        y = nvfp4_gemm(x2, w.packed, w.block_scale, w.global_scale, name=w.name)
    return y.reshape(*lead, w.out_features)


def _warm_tile(op) -> None:
    """One call per table row, so nothing loads lazily during a CUDA-graph capture."""
    from kernels import tile_gemm

    for max_m, _ in tile_gemm.TABLE:
        m = min(max_m, 256)
        tile_gemm.tile_gemm(torch.zeros(m, op.k, dtype=torch.bfloat16, device=op.words.device), op, 1.0,
                            sms=_sm_count(op.words.device))


@functools.lru_cache(maxsize=None)
def _warm(n: int, k: int, device: torch.device) -> None:
    """Run each table row once for (N, K) so Triton compiles before any CUDA-graph capture."""
    packed = torch.zeros(n, k // 2, dtype=torch.uint8, device=device)
    scale = torch.zeros(n, k // BLOCK, dtype=torch.uint8, device=device)
    for max_m, _ in tuning.TABLE:
        m = min(max_m, 256)
        nvfp4_gemm(torch.zeros(m, k, dtype=torch.bfloat16, device=device), packed, scale, 1.0)


# ---------------------------------------------------------------- launcher

H200_SMS = 132  # used off-GPU (Triton's CPU interpreter), so split-K decisions match the H200's


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_weight(packed: torch.Tensor, block_scale: torch.Tensor, name: str) -> None:
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"{name}: packed must be uint8 [N, K/2], found {packed.dtype} {tuple(packed.shape)}")
    n, half_k = packed.shape
    if block_scale.shape != (n, half_k * 2 // BLOCK) or block_scale.element_size() != 1:
        raise ValueError(f"{name}: block_scale must be 1-byte [{n}, {half_k * 2 // BLOCK}], "
                         f"found {block_scale.dtype} {tuple(block_scale.shape)}")
    if packed.stride(1) != 1 or block_scale.stride(1) != 1:
        raise ValueError(f"{name}: packed and block_scale need unit stride along K")


def _check_operands(x, packed, block_scale, name: str) -> tuple[int, int, int]:
    """(M, K, N) of a valid call, else a ValueError naming the tensor, expected vs found."""
    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"{name}: x must be bf16 [M, K], found {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"{name}: K must be a multiple of {BLOCK}, found K={k}")
    _check_weight(packed, block_scale, name)
    if packed.shape[1] * 2 != k:
        raise ValueError(f"{name}: x has K={k} but packed [N, K/2] has K={packed.shape[1] * 2}")
    return m, k, packed.shape[0]


def nvfp4_gemm(x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float,
               *, config: tuning.KernelConfig | None = None, out: torch.Tensor | None = None,
               name: str = "nvfp4_gemm") -> torch.Tensor:
    """y = x @ dequant(packed, block_scale, global_scale)^T, bf16 [M, N].

    `config` overrides the table (the benchmark's sweep); `out` is written instead of a fresh tensor.
    """
    m, k, n = _check_operands(x, packed, block_scale, name)
    if x.stride(1) != 1:
        x = x.contiguous()
    from kernels import nvfp4_triton as kt  # after validation: bad input errors need no Triton

    cfg = config or tuning.config_for(m)
    block_k, even_k = tuning.block_k_for(k, cfg)
    splits, k_per_split = tuning.split_k(m, n, k, cfg, block_k, _sm_count(x.device))
    y = _output(out, m, n, x.device, name)
    out = y if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (_cdiv(n, cfg.block_n), _cdiv(m, cfg.block_m), splits)
    words = packed.view(torch.int32)  # [N, K/8]: K % 16 == 0 makes every row whole words
    args = (x, words, block_scale.view(torch.uint8), out, m, n, k, k_per_split,
            x.stride(0), words.stride(0), block_scale.stride(0), n, m * n,
            float(global_scale) * _OUT_SCALE_SHIFT)
    if cfg.algo == "mma":
        args = (permute_x_for_mma(x), *args[1:])
    kernel = kt.gemv_kernel if cfg.algo == "gemv" else kt.mma_kernel
    kernel[grid](*args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, EVEN_K=even_k,
                 SPLIT=splits, NUM_STAGES=cfg.num_stages, USE_ASM=x.is_cuda, num_warps=cfg.num_warps)
    if splits > 1:
        block = 1024
        kt.reduce_splits_kernel[(_cdiv(m * n, block),)](out, y, m * n, SPLIT=splits, BLOCK=block)
    return y


def permute_x_for_mma(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> x with each 8 columns in the MMA kernel's weight order 0 4 1 5 2 6 3 7 (a copy)."""
    m, k = x.shape
    return x.view(m, k // 8, 2, 4).transpose(-1, -2).reshape(m, k)


def _output(out: torch.Tensor | None, m: int, n: int, device, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(m, n, dtype=torch.bfloat16, device=device)
    if out.shape != (m, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"{name}: out must be contiguous bf16 [{m}, {n}], found {out.dtype} {tuple(out.shape)}")
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    from engine.nvfp4 import quantize

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
        run = lambda x, out: tile_gemm(x, op, gs, out=out, sms=_sm_count(x.device))  # noqa: E731
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
