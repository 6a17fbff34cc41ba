"""The fused decode kernels (kernels/gdn_decode.py, decode_norm.py, attention_prep.py, paged_attention.py) against their
reference twins in engine.model, on fresh random inputs: on the GPU when there is one, else under
Triton's CPU interpreter (so CI checks the kernels' maths without a GPU)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off (tests/conftest.py turns it on)", allow_module_level=True)
triton = pytest.importorskip("triton")
from kernels import attention_prep, decode_norm, gdn_decode, gdn_prefill, paged_attention, paged_prefill  # noqa: E402
from engine.model.attention import paged_decode_attention  # noqa: E402
from engine.model.rope import Rope, apply_rope  # noqa: E402
from engine.model.delta_rule import recurrent_gated_delta_rule  # noqa: E402
from engine.model.norm import RMSNorm, gated_rms_norm  # noqa: E402
from kernels.policy import KernelPolicy  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF16 = torch.bfloat16


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's BF16 spacing (2^-7 relative), for values away from zero."""
    return (a.float() - b.float()).abs() / (b.float().abs().clamp_min(1e-3) * 2**-7)


@pytest.mark.parametrize("hk, hv, dk, dv", [(2, 4, 32, 32), (2, 6, 16, 32)])
def test_gated_deltanet_decode_step_matches_the_reference(hk, hv, dk, dv):
    g = torch.Generator().manual_seed(hk * 100 + hv)
    bsz, kern, n_slots, eps = 3, 4, 6, 1e-6
    conv_dim = 2 * hk * dk + hv * dv
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    qkv, z = r(bsz, conv_dim).to(BF16), r(bsz, hv * dv).to(BF16)
    b, a = r(bsz, hv).to(BF16), r(bsz, hv).to(BF16)
    conv_cache, conv_w = r(n_slots, conv_dim, kern - 1).to(BF16), r(conv_dim, kern, scale=0.5).to(BF16)
    rec = r(n_slots, hv, dk, dv, scale=0.1)
    a_log, dt_bias, norm_w = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), (1 + r(dv, scale=0.1)).to(BF16)
    slots = torch.tensor([4, 1, 2])  # scattered, not in order
    # reference (engine.model.gated_deltanet._decode, spelled out on plain tensors)
    window = torch.cat([conv_cache[slots], qkv.unsqueeze(-1)], dim=-1)
    ref_conv = conv_cache.clone()
    ref_conv[slots] = window[..., 1:]
    mixed = F.silu((window * conv_w).sum(-1)).to(BF16)
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
    beta = b.sigmoid()
    gdecay = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    out, state = recurrent_gated_delta_rule(q.reshape(bsz, 1, hk, dk), k.reshape(bsz, 1, hk, dk),
                                            v.reshape(bsz, 1, hv, dv), gdecay[:, None], beta[:, None], rec[slots])
    ref_rec = rec.clone()
    ref_rec[slots] = state
    ref_out = gated_rms_norm(out.reshape(-1, dv), z.reshape(-1, dv), norm_w, eps).reshape(bsz, -1)
    # fused
    dev = lambda t: t.to(DEV)  # noqa: E731
    conv_k, rec_k, slots_k = dev(conv_cache), dev(rec), dev(slots)
    mixed_k = gdn_decode.conv_step(dev(qkv), conv_k, slots_k, dev(conv_w))
    out_k = gdn_decode.delta_step(mixed_k, dev(z), dev(b), dev(a), rec_k, slots_k, dev(a_log), dev(dt_bias),
                                  dev(norm_w), num_k_heads=hk, head_k_dim=dk, head_v_dim=dv, eps=eps)
    assert torch.equal(conv_k.cpu(), ref_conv)  # the window shift is a copy: exact, other slots untouched
    assert _ulps(mixed_k.cpu(), mixed).max() <= 1.0
    torch.testing.assert_close(rec_k.cpu(), ref_rec, rtol=1e-4, atol=1e-5)
    assert torch.equal(rec_k.cpu()[[0, 3, 5]], rec[[0, 3, 5]])
    assert _ulps(out_k.cpu(), ref_out).max() <= 2.0  # BF16 output after FP32 sums in another order


def test_delta_step_with_an_fp16_state_does_its_maths_in_fp32_and_rounds_once_as_it_stores():
    """Option recurrent_state=fp16: the slot is loaded to FP32, updated and read out in FP32, and
    stored rounded to FP16, as the torch path does (engine.model.gated_deltanet._decode casts on the
    write)."""
    g = torch.Generator().manual_seed(7)
    dtype = torch.float16
    hk, hv, dk, dv, bsz, n_slots, eps = 2, 4, 32, 32, 2, 4, 1e-6
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    mixed, z = r(bsz, 2 * hk * dk + hv * dv).to(BF16), r(bsz, hv * dv).to(BF16)
    b, a = r(bsz, hv).to(BF16), r(bsz, hv).to(BF16)
    rec = r(n_slots, hv, dk, dv, scale=0.1).to(dtype)
    a_log, dt_bias, norm_w = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), (1 + r(dv, scale=0.1)).to(BF16)
    slots = torch.tensor([3, 0])
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
    gdecay = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    out, state = recurrent_gated_delta_rule(q.reshape(bsz, 1, hk, dk), k.reshape(bsz, 1, hk, dk),
                                            v.reshape(bsz, 1, hv, dv), gdecay[:, None], b.sigmoid()[:, None],
                                            rec[slots])  # reads the BF16 slots as FP32
    ref_out = gated_rms_norm(out.reshape(-1, dv), z.reshape(-1, dv), norm_w, eps).reshape(bsz, -1)
    rec_k = rec.clone().to(DEV)
    out_k = gdn_decode.delta_step(mixed.to(DEV), z.to(DEV), b.to(DEV), a.to(DEV), rec_k, slots.to(DEV), a_log.to(DEV),
                                  dt_bias.to(DEV), norm_w.to(DEV), num_k_heads=hk, head_k_dim=dk, head_v_dim=dv, eps=eps)
    assert rec_k.dtype == dtype
    err = (rec_k.cpu()[slots].float() - state).abs() / (state.abs().clamp_min(1e-3) * 2**-10)
    assert err.max() <= 1.0  # FP32 sums in another order, one rounding to the stored type
    assert (rec_k.cpu()[slots] != rec[slots]).float().mean() > 0.5  # it was written
    assert torch.equal(rec_k.cpu()[[1, 2]], rec[[1, 2]])
    assert _ulps(out_k.cpu(), ref_out).max() <= 2.0  # the output read from the FP32 state, as before


def _nan_filled(empty):
    def alloc(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    return alloc


@pytest.mark.parametrize("split", ["0", "1"])
def test_delta_step_split_over_programs_matches_the_reference_step_after_step(monkeypatch, split):
    """A head's DV columns over several programs (the rule's split: at batch 1, 4 of them here), the
    last one to finish norming the head, and one program per head (nv=1, as at large batch); two steps
    in a row (the ticket counters must be back at zero for the second), against the reference recurrence."""
    hk, hv, dk, dv, eps = 2, 6, 32, 64, 1e-6
    assert gdn_decode.programs_per_head(1, hv, dv) == 4
    nv = None if split == "1" else 1
    g = torch.Generator().manual_seed(11)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    rec = r(3, hv, dk, dv, scale=0.1)
    a_log, dt_bias, norm_w = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), (1 + r(dv, scale=0.1)).to(BF16)
    slots = torch.tensor([2])
    rec_k = rec.clone().to(DEV)
    for _ in range(2):
        mixed, z = r(1, 2 * hk * dk + hv * dv).to(BF16), r(1, hv * dv).to(BF16)
        b, a = r(1, hv).to(BF16), r(1, hv).to(BF16)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        gdecay = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
        out, state = recurrent_gated_delta_rule(q.reshape(1, 1, hk, dk), k.reshape(1, 1, hk, dk),
                                                v.reshape(1, 1, hv, dv), gdecay[:, None], b.sigmoid()[:, None], rec[slots])
        rec[slots] = state
        ref_out = gated_rms_norm(out.reshape(-1, dv), z.reshape(-1, dv), norm_w, eps).reshape(1, -1)
        with monkeypatch.context() as m:  # scratch allocated as NaN: a norm over unwritten columns shows
            m.setattr(gdn_decode.torch, "empty", _nan_filled(torch.empty))
            out_k = gdn_decode.delta_step(mixed.to(DEV), z.to(DEV), b.to(DEV), a.to(DEV), rec_k, slots.to(DEV),
                                          a_log.to(DEV), dt_bias.to(DEV), norm_w.to(DEV), num_k_heads=hk,
                                          head_k_dim=dk, head_v_dim=dv, eps=eps, nv=nv)
        torch.testing.assert_close(rec_k.cpu(), rec, rtol=1e-4, atol=1e-5)
        assert _ulps(out_k.cpu(), ref_out).max() <= 2.0
    if split == "1":
        assert int(gdn_decode._ticket_counters(DEV, hv).abs().sum()) == 0  # every head reset its counter


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the programs race only on a GPU")
def test_delta_step_split_agrees_with_one_program_per_head_over_many_steps(monkeypatch):
    """The 27b head shapes at batch 1 (48 heads x 8 programs): 30 steps with the split and without,
    on the same inputs; a ticket taken before another program's columns are visible would show as a
    wrong norm in some step."""
    hk, hv, dk, dv = 16, 48, 128, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, device="cuda") * scale  # noqa: E731
    rec = {"0": r(2, hv, dk, dv, scale=0.1)}
    rec["1"] = rec["0"].clone()
    a_log, dt_bias, norm_w = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), (1 + r(dv, scale=0.1)).to(BF16)
    slots = torch.tensor([1], device="cuda")
    for _ in range(30):
        mixed, z = r(1, 2 * hk * dk + hv * dv).to(BF16), r(1, hv * dv).to(BF16)
        b, a = r(1, hv).to(BF16), r(1, hv).to(BF16)
        out = {}
        for split in ("0", "1"):
            out[split] = gdn_decode.delta_step(mixed, z, b, a, rec[split], slots, a_log, dt_bias, norm_w,
                                               num_k_heads=hk, head_k_dim=dk, head_v_dim=dv, eps=1e-6,
                                               nv=None if split == "1" else 1)
        torch.testing.assert_close(rec["1"], rec["0"], rtol=1e-5, atol=1e-6)
        assert _ulps(out["1"], out["0"]).max() <= 2.0


@pytest.mark.parametrize("nv, warps", [(1, 1), (2, 2), (4, 4), (8, 1)])
def test_delta_step_at_an_explicit_split_and_warp_count_is_the_default_step(nv, warps):
    """delta_step(nv=, num_warps=) (tools/tune/delta_sweep.py times them): the same states and
    outputs as the rule's launch, batch 3 on scattered slots, two steps (the tickets back at zero);
    a split the kernel cannot run is refused by name."""
    hk, hv, dk, dv = 2, 4, 16, 64
    g = torch.Generator().manual_seed(nv * 10 + warps)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale)  # noqa: E731
    rec = {"rule": r(5, hv, dk, dv, scale=0.1).to(DEV)}
    rec["explicit"] = rec["rule"].clone()
    a_log, dt_bias, norm_w = r(hv, scale=0.5).to(BF16), r(hv, scale=0.5).to(BF16), (1 + r(dv, scale=0.1)).to(BF16)
    fixed = dict(A_log=a_log.to(DEV), dt_bias=dt_bias.to(DEV), norm_weight=norm_w.to(DEV), num_k_heads=hk,
                 head_k_dim=dk, head_v_dim=dv, eps=1e-6)
    slots = torch.tensor([4, 0, 2], device=DEV)
    for _ in range(2):
        mixed, z = r(3, 2 * hk * dk + hv * dv).to(BF16).to(DEV), r(3, hv * dv).to(BF16).to(DEV)
        b, a = r(3, hv).to(BF16).to(DEV), r(3, hv).to(BF16).to(DEV)
        out = {"rule": gdn_decode.delta_step(mixed, z, b, a, rec["rule"], slots, **fixed),
               "explicit": gdn_decode.delta_step(mixed, z, b, a, rec["explicit"], slots, **fixed, nv=nv,
                                                 num_warps=warps)}
        torch.testing.assert_close(rec["explicit"], rec["rule"], rtol=1e-5, atol=1e-6)
        assert _ulps(out["explicit"], out["rule"]).max() <= 2.0
    assert int(gdn_decode._ticket_counters(DEV, 1).abs().sum()) == 0
    for bad, match in (({"nv": 3}, "nv=3 must be a power of two"), ({"nv": 16}, "blocks of >= 8"),
                       ({"nv": 2, "num_warps": 3}, "num_warps=3 must be one of")):
        with pytest.raises(ValueError, match=match):
            gdn_decode.delta_step(mixed, z, b, a, rec["rule"], slots, **fixed, **bad)


@pytest.mark.parametrize("target, nv", [("256", 1), ("1024", 2), ("8192", 8), ("", 2), ("0", None), ("many", None)])
def test_the_split_target_moves_the_rule_and_a_bad_one_is_refused(target, nv):
    """The option delta_target: at batch 16 the 27b shape's 768 heads stay whole at 256 programs, split 2
    ways at 1024 (the default, "" here: the option not given) and 8 ways at 8192; a target that is no
    positive integer is refused, naming the option."""
    from engine.options import EngineOptions

    pairs = [f"delta_target={target}"] if target else []
    if nv is None:
        with pytest.raises(ValueError, match="option delta_target: expected"):
            EngineOptions.parse(pairs)
    else:
        assert gdn_decode.programs_per_head(16, 48, 128, EngineOptions.parse(pairs).kernels) == nv


def test_the_delta_sweep_times_every_launchable_split_with_the_reference_first():
    from tools.tune.delta_sweep import candidates

    c = candidates(128, 128)
    assert c[0] == (1, 8) and len(set(c)) == len(c)
    for nv, w in c:
        gdn_decode.check_split(nv, w, 128)  # every candidate launches
        assert 4 <= 128 * (128 // nv) / (32 * w) <= 128
    assert (16, 1) in c and (1, 1) not in c  # 8-column blocks of one warp (fla's shape); no spilling program


def test_add_rms_norm_and_rms_norm_match_the_reference():
    g = torch.Generator().manual_seed(7)
    h, d = (torch.randn(5, 300, generator=g) * 3).to(BF16), torch.randn(5, 300, generator=g).to(BF16)
    w = (torch.randn(300, generator=g) * 0.1).to(BF16)
    ref_res = h + d
    ref = RMSNorm(w, 1e-6)(ref_res)
    res, out = decode_norm.add_rms_norm(h.to(DEV), d.to(DEV), w.to(DEV), 1e-6)
    assert torch.equal(res.cpu(), ref_res)
    assert _ulps(out.cpu(), ref).max() <= 1.0
    assert _ulps(decode_norm.rms_norm(h.to(DEV), w.to(DEV), 1e-6).cpu(), RMSNorm(w, 1e-6)(h)).max() <= 1.0


@pytest.mark.parametrize("splits", [1, 3, 7])
def test_add_rms_norm_sums_split_k_partials_as_the_reduce_kernel_does(splits):
    from kernels.tile_gemm import SplitSum

    g = torch.Generator().manual_seed(splits)
    t, n, ldy, scale = 3, 300, 320, 2.0**19 * 3e-4  # ldy > n: the partials' rows are padded
    h, w = (torch.randn(t, n, generator=g) * 3).to(BF16), (torch.randn(n, generator=g) * 0.1).to(BF16)
    partial = torch.randn(splits, t, ldy, generator=g) * 40.0
    d = SplitSum(partial.to(DEV), n, scale)
    ref_d = partial[0, :, :n].clone()
    for k in range(1, splits):  # reduce_splits_kernel: FP32 adds in split order, then one scaled rounding
        ref_d += partial[k, :, :n]
    ref_d = (ref_d * scale).to(BF16)
    assert d.shape == (t, n) and torch.equal(d.materialize().cpu(), ref_d)
    res, out = decode_norm.add_rms_norm(h.to(DEV), d, w.to(DEV), 1e-6)
    res_ref, out_ref = decode_norm.add_rms_norm(h.to(DEV), ref_d.to(DEV), w.to(DEV), 1e-6)
    assert torch.equal(res.cpu(), (h + ref_d)) and torch.equal(res, res_ref) and torch.equal(out, out_ref)
    with pytest.raises(ValueError, match="d has shape"):
        decode_norm.add_rms_norm(h[:2].to(DEV), d, w.to(DEV), 1e-6)


@pytest.mark.parametrize("warps", [1, 4, 16, 32])
def test_add_rms_norm_at_any_warp_count_matches_the_reference(warps):
    """tools/tune/norm_sweep.py's launches: every warp count it times gives the reference's row (on a
    GPU the sum of squares is reduced in another order: within 1 BF16 ulp); a count not built is refused."""
    g = torch.Generator().manual_seed(warps)
    h, d = (torch.randn(2, 5120, generator=g) * 3).to(BF16), torch.randn(2, 5120, generator=g).to(BF16)
    w = (torch.randn(5120, generator=g) * 0.1).to(BF16)
    res, out = decode_norm.add_rms_norm(h.to(DEV), d.to(DEV), w.to(DEV), 1e-6, num_warps=warps)
    assert torch.equal(res.cpu(), h + d) and _ulps(out.cpu(), RMSNorm(w, 1e-6)(h + d)).max() <= 1.0
    with pytest.raises(ValueError, match=r"num_warps=3 must be one of \(1, 2, 4, 8, 16, 32\)"):
        decode_norm.add_rms_norm(h.to(DEV), d.to(DEV), w.to(DEV), 1e-6, num_warps=3)


def test_silu_mul_matches_the_reference():
    g = torch.Generator().manual_seed(8)
    gate, up = (torch.randn(4, 2500, generator=g) * 4).to(BF16), torch.randn(4, 2500, generator=g).to(BF16)
    out = decode_norm.silu_mul(gate.to(DEV), up.to(DEV)).cpu()
    assert _ulps(out, F.silu(gate) * up).max() <= 1.0


@pytest.mark.parametrize("h, hkv, d", [(4, 2, 32), (24, 4, 64)])
def test_paged_decode_attention_reads_live_blocks_and_matches_the_reference(h, hkv, d):
    g = torch.Generator().manual_seed(h)
    bs, num_blocks, max_blocks = 16, 60, 12
    lens = torch.tensor([1, 17, 150, 64])  # one token, a block plus one, several tiles, a tile exactly
    bsz = len(lens)
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    tables = torch.randperm(num_blocks, generator=g)[: bsz * max_blocks].reshape(bsz, max_blocks)
    q = torch.randn(bsz, h, d, generator=g).to(BF16)
    gate = torch.randn(bsz, h, 2 * d, generator=g).to(BF16)[..., d:]  # a strided view, as the model's chunk
    scale = d**-0.5
    ref = (paged_decode_attention(q, k_cache, v_cache, tables, lens, scale).reshape(bsz, -1)
           * torch.sigmoid(gate.reshape(bsz, -1)))
    # poison every block no sequence reads live: the kernel must never touch them
    live = {int(tables[i, j]) for i in range(bsz) for j in range((int(lens[i]) + bs - 1) // bs)}
    dead = [n for n in range(num_blocks) if n not in live]
    k_cache[dead], v_cache[dead] = float("nan"), float("nan")
    for tile, warps in ((paged_attention.TILE, paged_attention.WARPS), (16, 2), (32, 8), (128, 4)):  # the sweep's
        out = paged_attention.paged_decode_gated(q.to(DEV), k_cache.to(DEV), v_cache.to(DEV), tables.to(DEV),
                                                 lens.to(DEV), gate.to(DEV), scale, tile=tile, num_warps=warps).cpu()
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="tile=24 must be a power of two"):
        paged_attention.paged_decode_gated(q, k_cache, v_cache, tables, lens, gate, scale, tile=24)


@pytest.mark.parametrize("h, hkv, d, partial", [(4, 2, 32, 0.25), (6, 1, 64, 0.5), (2, 2, 16, 1.0)])
def test_attention_prep_norms_rotates_and_writes_the_cache_as_the_reference(h, hkv, d, partial):
    g = torch.Generator().manual_seed(h * 10 + d)
    bsz, bs, num_blocks = 3, 4, 5
    qg = (torch.randn(bsz, h, 2 * d, generator=g) * 3).to(BF16)  # q and gate interleaved per head, as the model
    q = qg[..., :d]
    kv = (torch.randn(bsz, 2, hkv, d, generator=g) * 2).to(BF16)
    k, v = kv[:, 0], kv[:, 1]  # strided views
    qw, kw = (torch.randn(d, generator=g) * 0.2).to(BF16), (torch.randn(d, generator=g) * 0.2).to(BF16)
    rope = Rope(d, partial, 10000.0)
    positions = torch.tensor([3, 0, 17])
    cos, sin = rope.cos_sin(positions, BF16)
    slots = torch.tensor([9, 2, 14])  # block 2 token 1, block 0 token 2, block 3 token 2
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(BF16)
    # reference: RMSNorm then apply_rope then the flat index_copy_ (engine.model.attention)
    ref_q = apply_rope(RMSNorm(qw, 1e-6)(q), cos, sin)
    ref_k = apply_rope(RMSNorm(kw, 1e-5)(k), cos, sin)
    ref_kc, ref_vc = k_cache.clone(), v_cache.clone()
    ref_kc.view(-1, hkv, d).index_copy_(0, slots, ref_k)
    ref_vc.view(-1, hkv, d).index_copy_(0, slots, v)
    kc, vc = k_cache.to(DEV), v_cache.to(DEV)
    out = attention_prep.attention_prep(q.to(DEV), k.to(DEV), v.to(DEV), qw.to(DEV), kw.to(DEV), 1e-6, 1e-5,
                                        cos.to(DEV), sin.to(DEV), slots.to(DEV), kc, vc)
    assert out.shape == (bsz, h, d)
    assert _ulps(out.cpu(), ref_q).max() <= 2.0  # one ulp from the norm's FP32 sum order, carried by RoPE
    assert _ulps(kc.cpu(), ref_kc).max() <= 2.0
    assert torch.equal(vc.cpu(), ref_vc)  # v is a copy; every slot not written is untouched
    untouched = [i for i in range(num_blocks * bs) if i not in slots.tolist()]
    assert torch.equal(kc.cpu().view(-1, hkv, d)[untouched], k_cache.view(-1, hkv, d)[untouched])


def test_attention_prep_refuses_what_it_cannot_index():
    q = torch.zeros(1, 2, 24, dtype=BF16)
    cache = torch.zeros(2, 4, 1, 24, dtype=BF16)
    cs = torch.zeros(1, 8, dtype=BF16)
    with pytest.raises(ValueError, match="power of two"):
        attention_prep.attention_prep(q, q[:, :1], q[:, :1], q[0, 0], q[0, 0], 1e-6, 1e-6, cs, cs,
                                      torch.zeros(1, dtype=torch.long), cache, cache)
    q = torch.zeros(1, 2, 16, dtype=BF16)
    cache = torch.zeros(2, 4, 1, 16, dtype=BF16).transpose(0, 1)  # a token's slot no longer indexes it flat
    with pytest.raises(ValueError, match="cache"):
        attention_prep.attention_prep(q, q[:, :1], q[:, :1], q[0, 0], q[0, 0], 1e-6, 1e-6, cs, cs,
                                      torch.zeros(1, dtype=torch.long), cache, cache)


@pytest.mark.parametrize("bucket, state", [(0, "fp32"), (16, "fp32"), (47, "fp32"), (0, "fp16")])
def test_the_engine_decodes_the_same_tokens_with_the_fused_kernels(monkeypatch, bucket, state):
    """The wiring (engine.fused -> the model's decode, prefill and norms) on the tiny checkpoint: the
    same greedy tokens and logits within FP32 noise, prompts of different lengths in one batch; the
    prefill's attention on its kernel (kernels/paged_prefill.py), so the prefill may be padded to a
    bucket keyed by shape (engine/prefill_graphs.py): 47 tokens to 48 (one padding token) or to 47
    (an empty padding sequence). With the option recurrent_state=fp16 both paths store the state in FP16."""
    from types import SimpleNamespace

    from engine.engine import Engine
    from engine.fused import bind_policy
    from engine.options import EngineOptions
    from engine_oracle import tiny

    ckpt = tiny()
    prompts = [[5, 17, 99, 3, 250, 8, 41], [7, 7, 300], list(range(40, 77))]
    off = EngineOptions(fused_decode=False, recurrent_state=state)  # the reference: the torch path
    ref = Engine(ckpt, backend=DEV.type, max_num_seqs=4, max_model_len=128, options=off).generate(prompts, 12)
    calls: dict[str, int] = {}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call
    options = EngineOptions(prefill_bucket=bucket, recurrent_state=state)
    bind = lambda fn: bind_policy(fn, options)  # noqa: E731  (as engine.fused binds them)
    kernels = SimpleNamespace(prefill=True, split_sum_in_norm=True, policy=options.kernels, **{name: counted(name, bind(fn)) for name, fn in (
        ("conv_prefill", gdn_prefill.conv_prefill), ("delta_prefill", gdn_prefill.delta_prefill),
        ("gated_rms_norm", gdn_prefill.gated_rms_norm),
        ("conv_step", gdn_decode.conv_step), ("delta_step", gdn_decode.delta_step),
        ("attention_prep", attention_prep.attention_prep), ("paged_decode_gated", paged_attention.paged_decode_gated),
        ("paged_prefill_gated", paged_prefill.paged_prefill_gated), ("rms_norm", decode_norm.rms_norm),
        ("add_rms_norm", decode_norm.add_rms_norm), ("silu_mul", decode_norm.silu_mul))})
    monkeypatch.setattr("engine.model.build.fused_kernels", lambda device, opts: kernels)
    eng = Engine(ckpt, backend=DEV.type, max_num_seqs=4, max_model_len=128, options=options)
    assert eng.model.fused is kernels and eng.model.layers[0].mixer.fused is kernels
    assert eng.runner().prefill_bucket == bucket and eng.runner().shares_prefill_graphs()
    assert eng.runner().state.recurrent_states.dtype == options.state_dtype
    assert eng.generate(prompts, 12) == ref
    steps, layers = 11, eng.model.config.num_hidden_layers  # 11 decode steps after the prefill's token
    gdn_layers = sum(1 for layer in eng.model.layers if hasattr(layer.mixer, "state_index"))
    # one prefill of the three prompts, its attention layers' norms, RoPE and K/V writes in attention_prep too
    assert calls["conv_prefill"] == calls["delta_prefill"] == calls["gated_rms_norm"] == gdn_layers
    assert calls["paged_prefill_gated"] == layers - gdn_layers
    if eng.runner().graphs:  # a CUDA graph calls the kernels once per captured bucket, then replays them
        assert calls["delta_step"] == calls["conv_step"] > 0
        assert calls["attention_prep"] == calls["paged_decode_gated"] + layers - gdn_layers > layers - gdn_layers
        assert calls["add_rms_norm"] >= 2 * layers and calls["silu_mul"] >= layers  # the eager prefill, at least
    else:
        assert calls["delta_step"] == calls["conv_step"] == steps * 3
        assert calls["paged_decode_gated"] == steps * (layers - gdn_layers)
        assert calls["attention_prep"] == (steps + 1) * (layers - gdn_layers)
        assert calls["add_rms_norm"] >= (steps + 1) * 2 * layers and calls["silu_mul"] >= (steps + 1) * layers


def test_fused_kernels_are_the_cuda_default_and_never_the_cpu_path():
    from engine import fused
    from engine.options import EngineOptions

    assert fused.fused_kernels(torch.device("cpu")) is None  # never on the CPU backend by itself
    on = fused.fused_kernels(torch.device("cuda"))  # picks functions only; nothing runs on a device here
    assert on is not None and on.delta_step.func is gdn_decode.delta_step
    assert on.delta_step.keywords == {"policy": KernelPolicy()}  # bound to the engine's policy, which it reads
    assert on.paged_prefill_gated is paged_prefill.paged_prefill_gated
    assert fused.fused_kernels(torch.device("cuda"), EngineOptions(fused_decode=False)) is None
    other = EngineOptions().with_kernels(delta_target=256)
    assert fused.fused_kernels(torch.device("cuda"), other).delta_step.keywords == {"policy": other.kernels}
    assert fused.fused_kernels(torch.device("cuda")).rms_norm is decode_norm.rms_norm  # takes no policy


def test_programmatic_dependent_launch_is_cuda_only():
    from kernels import pdl

    assert pdl.launch_options(torch.device("cuda")) == {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options(torch.device("cpu")) == {"PDL": False}  # the interpreter has no griddepcontrol
