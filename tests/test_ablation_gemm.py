"""tools/ablation/gemm.py, the ablated fp4 GEMM: `free` launches nothing, `empty` one kernel that does
nothing per launch of the GEMM and `read` only a plain read of the operand's bytes, and each returns
what the GEMM would (y, or a split launch's SplitSum with as many splits), unwritten; and
kernels.tile_gemm.splits, which says how many launches that is. Run on the CPU with the CUDA extension
forbidden: no launch of the GEMM can hide behind an ablation."""
from __future__ import annotations

import pytest
import torch

from kernels import merge, tile_gemm
from tools import plain_read
from kernels.policy import KernelPolicy
from kernels.tile_layout import repack
from nvfp4 import Nvfp4Weight, quantize
from tools.ablation import gemm as ablated


def _weight(name: str, n: int, k: int, seed: int, operand: bool = True) -> Nvfp4Weight:
    g = torch.Generator().manual_seed(seed)
    w = Nvfp4Weight.from_quantized(name, quantize(torch.randn(n, k, generator=g) * 0.02))
    w.kernel_operand = repack(w.packed, w.block_scale, name) if operand else None
    return w


@pytest.fixture
def reads(monkeypatch):
    """No GEMM kernel may launch; each plain read is recorded (the buffers it read), not run."""
    def no_extension():
        raise AssertionError("an ablated GEMM launched its kernel")
    got: list[tuple[int, int]] = []
    monkeypatch.setattr(tile_gemm, "extension", no_extension)
    monkeypatch.setattr(plain_read, "read_pair", lambda a, b: got.append((a.data_ptr(), b.data_ptr())))
    monkeypatch.setattr(plain_read, "empty_launch", lambda device: got.append(("empty", device.type)))
    return got


def _launched(mode: str, *pairs, launches: int = 1) -> list:
    """What the reads fixture records for GEMM launches over these (words, codes) pairs in `mode`, each
    GEMM `launches` kernels (2: a split launch and its reduce kernel)."""
    if mode == "read":
        return _ptrs(*pairs)
    return [("empty", "cpu")] * (launches * len(pairs)) if mode == "empty" else []


def _splits(m: int, op) -> int:
    """The launch's splits as tile_gemm computes them (its config, groups per split), and splits() agrees."""
    cfg = tile_gemm.table.tile_config(m, op.n, op.k)
    want = -(-(op.k // tile_gemm.K_GROUP) // tile_gemm.groups_per_split(m, op.n_main, op.k, cfg, 132))
    assert tile_gemm.splits(m, op, 132) == want
    return want


def _ptrs(*pairs) -> list[tuple[int, int]]:
    return [(a.data_ptr(), b.data_ptr()) for a, b in pairs]


@pytest.mark.parametrize("mode", ["free", "empty", "read"])
def test_a_split_launch_returns_its_splitsum_unwritten(reads, mode):
    w = _weight("layers.0.mlp.down_proj", 256, 4096, 0)
    x = torch.randn(1, 4096).to(torch.bfloat16)
    op = w.kernel_operand
    splits = _splits(1, op)
    assert splits > 1, "the shape must split K at M=1 for this test to mean anything"
    s = ablated.matmul_split(x, w, mode)
    assert isinstance(s, tile_gemm.SplitSum) and s.shape == (1, 256)
    assert s.partial.shape[0] == splits and s.partial.dtype == torch.float32
    assert s.scale == pytest.approx(w.global_scale * tile_gemm.OUT_SHIFT)
    assert reads == _launched(mode, (op.words, op.codes))


@pytest.mark.parametrize("mode", ["free", "empty", "read"])
def test_a_plain_and_a_merged_launch_return_y_unwritten(reads, mode):
    w = _weight("layers.0.mlp.up_proj", 256, 512, 1)
    x = torch.randn(3, 512).to(torch.bfloat16)
    y = ablated.matmul(x, w, mode)
    assert y.shape == (3, 256) and y.dtype == torch.bfloat16
    own = _ptrs((w.kernel_operand.words, w.kernel_operand.codes))  # before merging, which may move them
    m = merge.merge([w, _weight("layers.0.mlp.gate_proj", 128, 512, 2)])
    ym = ablated.matmul_merged(x, m, mode)
    assert ym.shape == (3, 384) and ym.dtype == torch.bfloat16
    assert _splits(3, m.op) == _splits(3, w.kernel_operand) == 2  # each is a split GEMM and its reduce
    assert reads == (own + _ptrs((m.op.words, m.op.codes)) if mode == "read" else _launched(mode, w, w, launches=2))


def test_an_empty_split_launch_summed_by_its_reduce_kernel_is_two_empty_launches(reads):
    """A split GEMM whose partials are not left to a consumer is the GEMM and its reduce kernel."""
    w = _weight("layers.0.linear_attn.in_proj_qkv", 256, 4096, 6)
    y = ablated.matmul(torch.randn(1, 4096).to(torch.bfloat16), w, "empty")
    assert y.shape == (1, 256) and reads == [("empty", "cpu")] * 2


def test_prefill_sized_m_is_ablated_too(reads):
    policy = KernelPolicy(dequant_min_m=64)  # every shape's dequantize + cuBLAS from M=64
    w = _weight("layers.0.mlp.up_proj", 256, 512, 3)
    assert tile_gemm.splits(64, w.kernel_operand, 132, policy) == 0 and tile_gemm.splits(63, w.kernel_operand, 132, policy)
    y = ablated.matmul(torch.randn(64, 512).to(torch.bfloat16), w, "read", policy)
    assert y.shape == (64, 256) and reads == _ptrs((w.kernel_operand.words, w.kernel_operand.codes))
    ablated.matmul(torch.randn(64, 512).to(torch.bfloat16), w, "empty", policy)
    assert reads[1:] == [("empty", "cpu")]  # one launch: the dequantize + cuBLAS path has no reduce


@pytest.mark.parametrize("mode", ["free", "empty", "read"])
def test_a_weight_without_a_tile_operand_reads_its_checkpoint_layout(reads, mode):
    w = _weight("layers.0.linear_attn.in_proj_b", 48, 512, 4, operand=False)
    y = ablated.matmul(torch.randn(2, 512).to(torch.bfloat16), w, mode)
    assert y.shape == (2, 48) and y.dtype == torch.bfloat16
    assert reads == _launched(mode, (w.packed, w.block_scale))


def test_an_unknown_mode_is_refused(reads):
    w = _weight("layers.0.mlp.up_proj", 256, 512, 5)
    x = torch.randn(1, 512).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"ablated GEMM: mode 'fast', expected one of \('free', 'empty', 'read'\)"):
        ablated.matmul(x, w, "fast")
    w.kernel_operand = None
    with pytest.raises(ValueError, match=r"mode 'fast'"):
        ablated.matmul(x, w, "fast")
    assert reads == []
