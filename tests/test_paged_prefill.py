"""The paged prefill attention kernel (kernels/paged_prefill.py) against the reference twin
(engine.model.attention.attend per sequence over the K/V gathered through its block table, times
sigmoid(gate), as GatedAttention._paged_prefill does it), on fresh random inputs: on the GPU when there
is one, else under Triton's CPU interpreter."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
pytest.importorskip("triton")
from kernels import paged_prefill  # noqa: E402
from engine.model.attention import attend  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16


def _case(h, hkv, d, lens, prefix, seed, bs=16, num_blocks=64):
    """Random q, gate, caches and tables for prompts of `lens` tokens, each after `prefix[i]` tokens
    already in its cache; every block no sequence reads is NaN (a read of one would show)."""
    g = torch.Generator().manual_seed(seed)
    ctx = [p + n for p, n in zip(prefix, lens)]
    width = max(-(-c // bs) for c in ctx) + 1  # one spare column: tables are padded past the context
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * width].reshape(len(lens), width)
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    live = {int(tables[i, j]) for i, c in enumerate(ctx) for j in range(-(-c // bs))}
    dead = [n for n in range(num_blocks) if n not in live]
    k_cache[dead], v_cache[dead] = float("nan"), float("nan")
    t = sum(lens)
    q = torch.randn(t, h, d, generator=g).to(BF16)
    gate = torch.randn(t, h, 2 * d, generator=g).to(BF16)[..., d:]  # a strided view, as the model's chunk
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, lens)])
    return q, gate, k_cache, v_cache, tables, cu, positions, ctx


def _reference(q, gate, k_cache, v_cache, tables, cu, ctx, scale):
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=BF16)
    bs = k_cache.shape[1]
    for i, n_ctx in enumerate(ctx):
        s, e = int(cu[i]), int(cu[i + 1])
        pos = torch.arange(n_ctx)
        slots = tables[i, pos // bs] * bs + pos % bs
        k = k_cache.view(-1, *k_cache.shape[2:])[slots]
        v = v_cache.view(-1, *v_cache.shape[2:])[slots]
        o = attend(q[s:e], k, v, n_ctx - (e - s), scale).reshape(e - s, -1)
        out[s:e] = o * torch.sigmoid(gate[s:e].reshape(e - s, -1))
    return out


def _run(q, gate, k_cache, v_cache, tables, cu, positions, scale, max_len, **launch):
    return paged_prefill.paged_prefill_gated(q.to(DEV), k_cache.to(DEV), v_cache.to(DEV), tables.to(DEV),
                                             cu.to(DEV), positions.to(DEV), gate.to(DEV), scale, max_len,
                                             **launch).cpu()


@pytest.mark.parametrize("h, hkv, d, lens, prefix", [
    (4, 2, 32, [1, 17, 70, 64], [0, 0, 0, 0]),  # one token, a block plus one, past a query tile, a tile exactly
    (24, 4, 64, [33, 5], [0, 0]),  # the 27b shape's GQA group of 6
    (4, 1, 32, [9, 40, 1], [20, 0, 77]),  # chunks continuing a context: positions not from 0
    pytest.param(24, 4, 256, [130, 7], [0, 0], marks=pytest.mark.skipif(  # the 27b head: 8 warps, registers full
        not torch.cuda.is_available(), reason="the 27b head size under the CPU interpreter takes minutes")),
])
def test_paged_prefill_matches_the_reference_and_reads_only_live_blocks(h, hkv, d, lens, prefix):
    q, gate, k_cache, v_cache, tables, cu, positions, ctx = _case(h, hkv, d, lens, prefix, seed=h * 7 + d)
    scale = d**-0.5
    ref = _reference(q, gate, k_cache, v_cache, tables, cu, ctx, scale)
    out = _run(q, gate, k_cache, v_cache, tables, cu, positions, scale, max(lens))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (32, 64), (128, 16)])
def test_every_launch_shape_the_sweep_times_matches_the_reference(block_m, block_n):
    """tools/tune/attention_sweep.py's prefill launches: other query tiles and key steps, the same
    attention (to rounding noise)."""
    q, gate, k_cache, v_cache, tables, cu, positions, ctx = _case(4, 2, 32, [1, 40, 70], [0, 5, 0], seed=block_m + block_n)
    ref = _reference(q, gate, k_cache, v_cache, tables, cu, ctx, 0.2)
    out = _run(q, gate, k_cache, v_cache, tables, cu, positions, 0.2, 70, block_m=block_m, block_n=block_n,
               num_warps=4)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="powers of two >= 16"):
        _run(q, gate, k_cache, v_cache, tables, cu, positions, 0.2, 70, block_n=8)


def test_a_grid_past_the_longest_prompt_changes_nothing():
    """A bound above the longest prompt (as a graph captured for a larger batch has) writes the same
    values: the extra tiles find no query of theirs."""
    q, gate, k_cache, v_cache, tables, cu, positions, _ = _case(4, 2, 32, [3, 66], [0, 0], seed=3)
    exact = _run(q, gate, k_cache, v_cache, tables, cu, positions, 0.2, 66)
    wide = _run(q, gate, k_cache, v_cache, tables, cu, positions, 0.2, 200)
    assert torch.equal(exact, wide)


def test_paged_prefill_refuses_what_it_cannot_index():
    q, gate, k_cache, v_cache, tables, cu, positions, _ = _case(4, 2, 32, [3], [0], seed=1)
    with pytest.raises(ValueError, match="power of two"):
        paged_prefill.paged_prefill_gated(q[..., :24], k_cache[..., :24], v_cache[..., :24], tables, cu, positions,
                                          gate[..., :24], 0.2, 3)
    with pytest.raises(ValueError, match="multiple of the 2 KV heads"):
        paged_prefill.paged_prefill_gated(q[:, :3], k_cache, v_cache, tables, cu, positions, gate[:, :3], 0.2, 3)
    with pytest.raises(ValueError, match="contiguous last dim"):
        paged_prefill.paged_prefill_gated(q, k_cache, v_cache, tables, cu, positions, gate.transpose(1, 2), 0.2, 3)
    with pytest.raises(ValueError, match="positions"):
        paged_prefill.paged_prefill_gated(q, k_cache, v_cache, tables, cu, positions[:2], gate, 0.2, 3)
    with pytest.raises(ValueError, match="max_len"):
        paged_prefill.paged_prefill_gated(q, k_cache, v_cache, tables, cu, positions, gate, 0.2, 0)
