"""Model pieces against their reference twins and transformers' own functions, on fresh random inputs."""
from __future__ import annotations

import pytest
import torch

from engine.linear import dequant_for_call
from engine.model.attention import attend, paged_decode_attention
from engine.model.delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule
from engine.model.norm import RMSNorm, gated_rms_norm
from engine.model.rope import Rope, apply_rope
from nvfp4 import Nvfp4Weight, quantize
from gates.suites.support import reference_modeling

pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
tf = reference_modeling()  # transformers' Qwen3.5 on its PyTorch paths, whatever is installed
TOL = dict(atol=2e-5, rtol=1e-5)  # FP32, op order only


def _delta_inputs(gen, b=2, t=37, hk=2, hv=4, dk=16, dv=8):
    q, k = torch.randn(b, t, hk, dk, generator=gen), torch.randn(b, t, hk, dk, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen)
    g = -torch.rand(b, t, hv, generator=gen) * 2  # log decay <= 0
    beta = torch.rand(b, t, hv, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("seed", [0, 1])
def test_delta_rule_chunked_equals_recurrent_and_the_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta = _delta_inputs(gen)
    state0 = torch.randn(2, 4, 16, 8, generator=gen)
    out_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, state0, chunk_size=16)
    out_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, state0)
    torch.testing.assert_close(out_c, out_r, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_c, s_r, atol=1e-4, rtol=1e-4)
    ref_out, ref_s = tf.torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, initial_state=state0,
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out_c, ref_out, **TOL)
    torch.testing.assert_close(s_c, ref_s, **TOL)
    ref_out, ref_s = tf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state0,
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out_r, ref_out, **TOL)


def test_rms_norms_match_the_reference():
    gen = torch.Generator().manual_seed(2)
    x, gate, w = torch.randn(5, 32, generator=gen), torch.randn(5, 32, generator=gen), torch.randn(32, generator=gen)
    ref = tf.Qwen3_5RMSNorm(32, eps=1e-6)
    ref.weight.data.copy_(w)
    torch.testing.assert_close(RMSNorm(w, 1e-6)(x), ref(x), atol=0, rtol=0)
    ref_g = tf.Qwen3_5RMSNormGated(32, eps=1e-6)
    ref_g.weight.data.copy_(w)
    torch.testing.assert_close(gated_rms_norm(x, gate, w, 1e-6), ref_g(x, gate), atol=0, rtol=0)


def test_partial_rope_matches_the_reference():
    gen = torch.Generator().manual_seed(3)
    t, h, d = 6, 3, 32
    q, k = torch.randn(t, h, d, generator=gen), torch.randn(t, h, d, generator=gen)
    rope = Rope(d, 0.25, 1e7)
    pos = torch.arange(10, 10 + t)
    cos, sin = rope.cos_sin(pos, torch.float32)
    ref_q, ref_k = tf.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    torch.testing.assert_close(apply_rope(q, cos, sin), ref_q[0].transpose(0, 1), atol=0, rtol=0)
    torch.testing.assert_close(apply_rope(k, cos, sin)[..., 8:], k[..., 8:], atol=0, rtol=0)  # 0.25 of 32 rotate


def test_paged_decode_attention_equals_contiguous_attention():
    gen = torch.Generator().manual_seed(4)
    bs, hkv, h, d = 4, 2, 4, 16
    lens = [7, 3, 12]
    k_cache, v_cache = torch.randn(10, bs, hkv, d, generator=gen), torch.randn(10, bs, hkv, d, generator=gen)
    tables = torch.tensor([[9, 2, 0], [5, 0, 0], [1, 8, 3]])  # scattered, padded with block 0
    q = torch.randn(3, h, d, generator=gen)
    out = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lens), d**-0.5)
    for i, n in enumerate(lens):
        pos = torch.arange(n)
        slots = tables[i, pos // bs] * bs + pos % bs
        k = k_cache.view(-1, hkv, d)[slots]
        v = v_cache.view(-1, hkv, d)[slots]
        ref = attend(q[i : i + 1], k, v, n - 1, d**-0.5)
        torch.testing.assert_close(out[i], ref[0], **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequant_for_call_is_bit_identical_to_dequantize(dtype):
    gen = torch.Generator().manual_seed(5)
    w = Nvfp4Weight.from_quantized("w", quantize(torch.randn(24, 64, generator=gen) * 0.1))
    assert torch.equal(dequant_for_call(w, dtype), w.dequantize(dtype))
