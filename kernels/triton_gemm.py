"""The Triton kernels' launcher: y[M, N] = x[M, K] @ dequant(W)^T on the checkpoint layout.

Validates the operands (a bad shape or dtype is a ValueError naming the tensor), picks the config
of `table.TRITON` for M (or the caller's: the sweep's), splits K where the output tiles cannot fill
the SMs, and launches `kernels/nvfp4_triton.py`. Used by `nvfp4_gemm.matmul` for the weights the tile
layout cannot hold and by `tile_gemm` for the N % 16 tail rows. Triton is imported lazily, after
validation: bad input errors need no Triton.
"""
from __future__ import annotations

import functools

import torch

from nvfp4 import BLOCK
from kernels import table

_OUT_SCALE_SHIFT = 2.0**22  # the 2^-14 of the E2M1 trick times the 2^-8 of the E4M3 trick


H200_SMS = 132  # used off-GPU (Triton's CPU interpreter), so split-K decisions match the H200's


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_weight(packed: torch.Tensor, block_scale: torch.Tensor, name: str) -> None:
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
    check_weight(packed, block_scale, name)
    if packed.shape[1] * 2 != k:
        raise ValueError(f"{name}: x has K={k} but packed [N, K/2] has K={packed.shape[1] * 2}")
    return m, k, packed.shape[0]


def nvfp4_gemm(x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float,
               *, config: table.KernelConfig | None = None, out: torch.Tensor | None = None,
               name: str = "nvfp4_gemm") -> torch.Tensor:
    """y = x @ dequant(packed, block_scale, global_scale)^T, bf16 [M, N].

    `config` overrides the table (the benchmark's sweep); `out` is written instead of a fresh tensor.
    """
    m, k, n = _check_operands(x, packed, block_scale, name)
    if x.stride(1) != 1:
        x = x.contiguous()
    from kernels import nvfp4_triton as kt  # after validation: bad input errors need no Triton

    cfg = config or table.config_for(m, table.TRITON)
    block_k, even_k = table.block_k_for(k, cfg)
    splits, k_per_split = table.split_k(m, n, k, cfg, block_k, sm_count(x.device))
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
