"""regate's Gated DeltaNet kernels against fla-core's: `python -m tools.tune.field_compare [--json]`.

Issue 24 asks to choose by measurement between field libraries and our own kernels. At the 27b shape
(16 key heads, 48 value heads, head dim 128) and on the same random inputs, this runs
- decode (one token per sequence): kernels/gdn_decode.delta_step (L2 norms, gates, the state slot
  updated in place, the gated RMSNorm) against fla's `fused_recurrent_gated_delta_rule` (gates and L2
  norms in its kernel, the state read from one tensor and written to another), alone and as the
  engine would have to use it (q/k/v made contiguous, the slots gathered, the gated RMSNorm, the
  final state written back to the cache);
- prefill (one prompt of --prompt-len tokens per sequence): kernels/gdn_prefill.delta_prefill
  (token by token, the state in registers) against fla's `chunk_gated_delta_rule` (chunked, tensor
  cores), both before the gated RMSNorm, both writing the final state.
Each pair is checked against each other (max |difference| of the outputs and of the final states)
before it is timed, the states rotated past L2: decode as CUDA-graph replays (as the engine decodes),
prefill eagerly, host launch cost included (as the engine prefills). Prints a table, then one JSON line. Tuning code: no product module imports it, and fla is imported only here.

On the GPU box: `bash scripts/device_kernels.sh fieldcompare` with fla-core's and einops' wheels in
.whl/ (`bash ../shared/tools/device-wheels.sh ... fla-core einops`), carried. flashinfer-python's wheel
(101 MB for 0.7.4) is over the 64 MiB a device call may carry, so its paged decode attention is not
compared here.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch

from tools.tune.bench import copies_for, environment, median_ms

HK, HV, DK, DV = 16, 48, 128, 128  # the 27b preset's Gated DeltaNet
KEY_DIM, CONV_DIM = HK * DK, 2 * HK * DK + HV * DV
EPS = 1e-6


def inputs(bsz: int, tokens: int, seed: int) -> dict:
    """Post-conv q|k|v rows, gates, the gated norm's z and weight, A_log, dt_bias: the engine's layout."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()
    n = bsz * tokens
    return {"mixed": rnd(n, CONV_DIM), "z": rnd(n, HV * DV), "b": rnd(n, HV), "a": rnd(n, HV),
            "A_log": torch.rand(HV, generator=g, device="cuda") * 2 - 1,
            "dt_bias": torch.randn(HV, generator=g, device="cuda") * 0.5,
            "norm_w": rnd(DV, scale=0.1) + 1}


def qkv(mixed: torch.Tensor, bsz: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fla's [B, T, H, D] views (contiguous copies) of the engine's q|k|v rows."""
    q, k, v = mixed.split([KEY_DIM, KEY_DIM, HV * DV], dim=-1)
    return (q.reshape(bsz, tokens, HK, DK).contiguous(), k.reshape(bsz, tokens, HK, DK).contiguous(),
            v.reshape(bsz, tokens, HV, DV).contiguous())


def states(bsz: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(bsz, HV, DK, DV, generator=g, device="cuda") * 0.1


def decode_pair(bsz: int) -> dict:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    from kernels.gdn_decode import delta_step
    from kernels.gdn_prefill import gated_rms_norm

    x = inputs(bsz, 1, seed=bsz)
    slots = torch.arange(bsz, device="cuda")
    q, k, v = qkv(x["mixed"], bsz, 1)
    gate, beta = x["a"].view(bsz, 1, HV), x["b"].view(bsz, 1, HV)

    def ours(rec):
        return delta_step(x["mixed"], x["z"], x["b"], x["a"], rec, slots, x["A_log"], x["dt_bias"], x["norm_w"],
                          num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, eps=EPS)

    def fla_kernel(rec, q=q, k=k, v=v):
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=gate, beta=beta, scale=DK**-0.5, initial_state=rec, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
            use_beta_sigmoid_in_kernel=True)

    def fla_path(rec):  # what the engine would run around it: layout in, norm, the state back in its slots
        o, final = fla_kernel(rec[slots], *qkv(x["mixed"], bsz, 1))
        rec.index_copy_(0, slots, final)
        return gated_rms_norm(o.reshape(bsz, HV * DV), x["z"], x["norm_w"], EPS)

    s0 = states(bsz, seed=7)
    mine, theirs = s0.clone(), s0.clone()
    y_ours, y_fla = ours(mine), fla_path(theirs)
    agree = diffs(y_ours, y_fla, mine, theirs)
    nbytes = s0.numel() * 4
    copies = [states(bsz, seed=100 + i) for i in range(copies_for(nbytes))]
    return {"op": "decode", "batch": bsz, **agree, "state_mib": nbytes / 2**20,
            "us": {name: 1e3 * rotated(fn, copies) for name, fn in
                   (("regate delta_step", ours), ("fla kernel", fla_kernel), ("fla path", fla_path))}}


def prefill_pair(bsz: int, tokens: int) -> dict:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from kernels.gdn_prefill import delta_prefill

    x = inputs(bsz, tokens, seed=1000 + bsz)
    cu = torch.arange(0, (bsz + 1) * tokens, tokens, dtype=torch.int32, device="cuda")
    cu_long, cu_cpu = cu.long(), cu.long().cpu()
    slots = torch.arange(bsz, device="cuda")
    q, k, v = qkv(x["mixed"], 1, bsz * tokens)
    gate, beta = x["a"].view(1, bsz * tokens, HV), x["b"].view(1, bsz * tokens, HV)

    def ours(rec):
        return delta_prefill(x["mixed"], x["b"], x["a"], cu, rec, slots, x["A_log"], x["dt_bias"],
                             num_k_heads=HK, head_k_dim=DK, head_v_dim=DV)

    def fla(rec):
        o, final = chunk_gated_delta_rule(
            q, k, v, g=gate, beta=beta, scale=DK**-0.5, initial_state=None, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu_long, cu_seqlens_cpu=cu_cpu,
            use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
        rec.copy_(final)
        return o.reshape(bsz * tokens, HV * DV)

    mine, theirs = states(bsz, 0), states(bsz, 0)
    y_ours, y_fla = ours(mine), fla(theirs)
    agree = diffs(y_ours, y_fla, mine, theirs)
    copies = [states(bsz, seed=200 + i) for i in range(copies_for(mine.numel() * 4))]
    return {"op": f"prefill {tokens}", "batch": bsz, **agree, "state_mib": mine.numel() * 4 / 2**20,
            "us": {"regate delta_prefill": 1e3 * rotated(ours, copies, graph=False),
                   "fla chunk": 1e3 * rotated(fla, copies, graph=False)}}


def diffs(y_ours, y_fla, s_ours, s_fla) -> dict:
    """How far the two agree, beside the size of what they computed (ours as the yardstick)."""
    return {"out_max_abs": float((y_ours.float() - y_fla.float()).abs().max()), "out_max": float(y_ours.float().abs().max()),
            "state_max_abs": float((s_ours - s_fla).abs().max()), "state_max": float(s_ours.abs().max())}


def rotated(fn, copies: list[torch.Tensor], graph: bool = True) -> float:
    """Median ms of one call, each call on the next state copy (the copies past L2 together)."""
    ring = itertools.cycle(copies)
    return median_ms(lambda: fn(next(ring)), graph=graph)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.field_compare", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("field_compare: needs a CUDA GPU (fla's kernels are Triton GPU kernels)")
    rows = []
    for bsz in map(int, a.batches.split(",")):
        rows.append(decode_pair(bsz))
        rows.append(prefill_pair(bsz, a.prompt_len))
    if not a.json:
        print(f"{'op':<12} {'batch':>5} {'state MiB':>9}  {'times (us)':<70} {'|out diff| / max':>20} "
              f"{'|state diff| / max':>20}")
        for r in rows:
            times = ", ".join(f"{k} {v:.1f}" for k, v in r["us"].items())
            print(f"{r['op']:<12} {r['batch']:>5} {r['state_mib']:>9.1f}  {times:<70} "
                  f"{r['out_max_abs']:>9.3g} / {r['out_max']:<8.3g} {r['state_max_abs']:>9.3g} / {r['state_max']:<8.3g}")
    print(json.dumps({"field_compare": rows, **environment()}))


if __name__ == "__main__":
    main()
