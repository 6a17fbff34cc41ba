"""The fused prefill kernels of Gated DeltaNet (kernels/gdn_prefill.py) against the reference twin
(engine.model.gated_deltanet._prefill: conv1d, SiLU, chunk_gated_delta_rule from a zero state, the
conv window and state stored per sequence), on fresh random inputs: on the GPU when there is one,
else under Triton's CPU interpreter."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
pytest.importorskip("triton")
from kernels import gdn_prefill  # noqa: E402
from engine.model.delta_rule import chunk_gated_delta_rule  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's BF16 spacing (2^-7 relative), for values away from zero."""
    return (a.float() - b.float()).abs() / (b.float().abs().clamp_min(1e-2) * 2**-7)


def _reference(qkv, b, a, conv_w, a_log, dt_bias, lens, hk, dk, dv):
    """Per sequence, as engine.model.gated_deltanet._prefill: (core out [T, Hv*Dv], windows, states)."""
    kern, outs, windows, states, start = conv_w.shape[1], [], [], [], 0
    beta = b.sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    for n in lens:
        x = qkv[start:start + n]
        window = F.pad(x.t().unsqueeze(0), (kern - 1, 0))
        mixed = F.silu(F.conv1d(window, conv_w.unsqueeze(1), groups=conv_w.shape[0])[..., -n:]).to(BF16)[0].t()
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, mixed.shape[1] - 2 * hk * dk], dim=-1)
        out, state = chunk_gated_delta_rule(q.reshape(1, n, hk, dk), k.reshape(1, n, hk, dk), v.reshape(1, n, -1, dv),
                                            g[None, start:start + n], beta[None, start:start + n])
        outs.append(out[0].reshape(n, -1))
        windows.append(window[0, :, -(kern - 1):])
        states.append(state[0])
        start += n
    return torch.cat(outs), windows, states


@pytest.mark.parametrize("hk, hv, dk, dv, lens", [(2, 4, 32, 32, [5, 1, 70]), (1, 3, 16, 64, [2, 9])])
def test_gated_deltanet_prefill_matches_the_chunked_reference(hk, hv, dk, dv, lens):
    """Sequences shorter than the conv window, of one token, and longer than a 64-token chunk."""
    g = torch.Generator().manual_seed(hv * 10 + dv)
    kern, n_slots = 4, 5
    total, conv_dim = sum(lens), 2 * hk * dk + hv * dv
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    qkv, b, a = r(total, conv_dim).to(BF16), r(total, hv).to(BF16), r(total, hv).to(BF16)
    conv_w = r(conv_dim, kern, scale=0.5).to(BF16)
    a_log, dt_bias = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16)
    conv_cache, rec = r(n_slots, conv_dim, kern - 1).to(BF16), r(n_slots, hv, dk, dv)
    slots = torch.tensor([3, 0, 4][: len(lens)])
    ref_out, ref_windows, ref_states = _reference(qkv, b, a, conv_w, a_log, dt_bias, lens, hk, dk, dv)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    dev = lambda t: t.to(DEV)  # noqa: E731
    conv_k, rec_k, cu_k = dev(conv_cache), dev(rec), dev(cu)
    mixed = gdn_prefill.conv_prefill(dev(qkv), cu_k, gdn_prefill.token_seq(cu_k, total), conv_k, dev(slots),
                                     dev(conv_w))
    out = gdn_prefill.delta_prefill(mixed, dev(b), dev(a), cu_k, rec_k, dev(slots), dev(a_log), dev(dt_bias),
                                    num_k_heads=hk, head_k_dim=dk, head_v_dim=dv, block_v=16)
    assert out.shape == ref_out.shape
    err = _ulps(out.cpu(), ref_out)
    assert err.max() <= 4.0 and err.mean() < 0.05  # BF16 outputs after FP32 sums in another order
    untouched = [i for i in range(n_slots) if i not in slots.tolist()]
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(conv_k.cpu()[slot], ref_windows[i])  # a copy of the last inputs, zeros before
        torch.testing.assert_close(rec_k.cpu()[slot], ref_states[i], rtol=1e-3, atol=1e-4)
    assert torch.equal(conv_k.cpu()[untouched], conv_cache[untouched])
    assert torch.equal(rec_k.cpu()[untouched], rec[untouched])


def test_delta_prefill_stores_an_fp16_state_rounded_once():
    """Option recurrent_state=fp16: the prefill's final state, computed in FP32, stored rounded to the
    cache's FP16."""
    dtype = torch.float16
    g = torch.Generator().manual_seed(3)
    hk, hv, dk, dv, kern, lens = 2, 4, 32, 32, 4, [9, 70]
    total, conv_dim = sum(lens), 2 * hk * dk + hv * dv
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    qkv, b, a = r(total, conv_dim).to(BF16), r(total, hv).to(BF16), r(total, hv).to(BF16)
    conv_w, a_log, dt_bias = r(conv_dim, kern, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16)
    _, _, ref_states = _reference(qkv, b, a, conv_w, a_log, dt_bias, lens, hk, dk, dv)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(DEV)
    conv_k, rec_k, slots = torch.zeros(3, conv_dim, kern - 1, dtype=BF16, device=DEV), torch.zeros(3, hv, dk, dv, dtype=dtype,
                                                                                                 device=DEV), torch.tensor([2, 0])
    mixed = gdn_prefill.conv_prefill(qkv.to(DEV), cu, gdn_prefill.token_seq(cu, total), conv_k, slots.to(DEV), conv_w.to(DEV))
    gdn_prefill.delta_prefill(mixed, b.to(DEV), a.to(DEV), cu, rec_k, slots.to(DEV), a_log.to(DEV), dt_bias.to(DEV),
                              num_k_heads=hk, head_k_dim=dk, head_v_dim=dv)
    assert rec_k.dtype == dtype and not rec_k[1].any()  # the slot no sequence owns: untouched
    for i, slot in enumerate(slots.tolist()):  # the FP32 tolerance above, plus one BF16 rounding
        torch.testing.assert_close(rec_k.cpu()[slot].float(), ref_states[i], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("block_v, warps", [(8, 1), (16, 2), (64, 8), (32, 4)])
def test_delta_prefill_at_any_launch_shape_gives_the_default_launchs_values(block_v, warps):
    """tools/tune/delta_prefill_sweep.py's launches: outputs within 1 BF16 ulp and states within FP32
    reordering of the engine's (BLOCK_V, WARPS) launch; a warp count not in WARP_COUNTS is refused."""
    g = torch.Generator().manual_seed(block_v + warps)
    hk, hv, dk, dv, lens = 2, 4, 32, 64, [3, 40]
    t = sum(lens)
    mixed = torch.randn(t, 2 * hk * dk + hv * dv, generator=g).to(BF16).to(DEV)
    b, a = (torch.randn(t, hv, generator=g).to(BF16).to(DEV) for _ in range(2))
    a_log, dt_bias = (torch.randn(hv, generator=g).to(BF16).to(DEV) * 0.5 for _ in range(2))
    cu = torch.tensor([0, 3, 43], dtype=torch.int32).to(DEV)
    slots = torch.tensor([1, 0]).to(DEV)
    outs, states = [], []
    for bv, w in ((gdn_prefill.BLOCK_V, gdn_prefill.WARPS), (block_v, warps)):
        rec = torch.zeros(2, hv, dk, dv).to(DEV)
        outs.append(gdn_prefill.delta_prefill(mixed, b, a, cu, rec, slots, a_log, dt_bias, num_k_heads=hk,
                                              head_k_dim=dk, head_v_dim=dv, block_v=bv, num_warps=w).cpu())
        states.append(rec.cpu())
    assert _ulps(outs[1], outs[0]).max() <= 1.0
    torch.testing.assert_close(states[1], states[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"num_warps=3 must be one of \(1, 2, 4, 8\)"):
        gdn_prefill.delta_prefill(mixed, b, a, cu, None, None, a_log, dt_bias, num_k_heads=hk, head_k_dim=dk,
                                  head_v_dim=dv, num_warps=3)


def test_delta_prefill_without_a_cache_and_refusals():
    g = torch.Generator().manual_seed(1)
    mixed = torch.randn(6, 2 * 16 + 2 * 32, generator=g).to(BF16)
    ba = torch.randn(6, 2, generator=g).to(BF16)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    p = torch.zeros(2, dtype=BF16)
    out = gdn_prefill.delta_prefill(mixed.to(DEV), ba.to(DEV), ba.to(DEV), cu.to(DEV), None, None, p.to(DEV),
                                    p.to(DEV), num_k_heads=1, head_k_dim=16, head_v_dim=32)
    assert out.shape == (6, 64) and torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match="powers of two"):
        gdn_prefill.delta_prefill(mixed, ba, ba, cu, None, None, p, p, num_k_heads=1, head_k_dim=16, head_v_dim=24)
    with pytest.raises(ValueError, match="conv_cache"):
        gdn_prefill.conv_prefill(mixed, cu, gdn_prefill.token_seq(cu, 6), torch.zeros(1, 4, 96, dtype=BF16).transpose(1, 2),
                                 torch.zeros(1, dtype=torch.long), torch.zeros(96, 4, dtype=BF16))


def test_gated_rms_norm_matches_the_reference_on_strided_rows():
    from engine.model.norm import gated_rms_norm

    g = torch.Generator().manual_seed(3)
    t, hv, dv = 7, 3, 32
    x = (torch.randn(t, hv * dv, generator=g) * 2).to(BF16)
    zz = torch.randn(t, 2 * hv * dv, generator=g).to(BF16)
    z = zz[:, hv * dv:]  # a view with a longer row stride, as the merged projection's output
    w = (1 + torch.randn(dv, generator=g) * 0.1).to(BF16)
    ref = gated_rms_norm(x.reshape(-1, dv), z.reshape(-1, dv), w, 1e-6).reshape(t, -1)
    out = gdn_prefill.gated_rms_norm(x.to(DEV), z.to(DEV), w.to(DEV), 1e-6).cpu()
    assert _ulps(out, ref).max() <= 1.0
    with pytest.raises(ValueError, match="power of two"):
        gdn_prefill.gated_rms_norm(x, z, torch.ones(24, dtype=BF16), 1e-6)
