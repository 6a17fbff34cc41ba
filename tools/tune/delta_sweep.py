"""How to split the decode delta rule: `python -m tools.tune.delta_sweep [--batches 1,16] [--json]`.

kernels/gdn_decode.delta_step at the 27b Gated DeltaNet shape (16 key heads, 48 value heads, head
dim 128) for every split of a head's DV columns over programs (`nv`) and warps per program, each
checked against one program of 8 warps per head (states within FP32 reordering, outputs within 2
BF16 ulps) before it is timed as CUDA-graph replays with the state slots rotated past L2 (as 48
layers of decoding rotate them). The rule the engine uses (`programs_per_head`, the option delta_target)
is marked. Beside each time, the floor: every state byte read once and written once at the read
bandwidth this command measures. Prints a table, then one JSON line. Tuning code: no product module
imports it.
"""
from __future__ import annotations

import json

import torch

from kernels import gdn_decode
from tools.tune.bench import copies_for, environment, fastest_by_batch, read_bandwidth_gbps, sweep_cli
from tools.tune.field_compare import DK, DV, EPS, HK, HV, inputs, rotated, states

SPLITS = (1, 2, 4, 8, 16)


def candidates(dk: int = DK, dv: int = DV) -> list[tuple[int, int]]:
    """(nv, num_warps) pairs delta_step launches: column blocks of at least 8, and 4 to 128 state
    elements a thread (fewer only idle threads, more spill registers); one program of 8 warps (the
    reference) first."""
    out = [(1, 8)]
    for nv in SPLITS:
        for w in gdn_decode.WARPS:
            per_thread = dk * (dv // nv) / (32 * w) if dv % nv == 0 else 0
            if dv // nv >= 8 and 4 <= per_thread <= 128 and (nv, w) not in out:
                out.append((nv, w))
    return out


def sweep(bsz: int, gbps: float, show=None) -> list[dict]:
    """The rows of one batch; `show(row)` is called on each as it is measured (a cut run keeps them)."""
    x = inputs(bsz, 1, seed=bsz)
    slots = torch.arange(bsz, device="cuda")
    rule = (gdn_decode.programs_per_head(bsz, HV, DV), None)

    def step(rec, nv, warps):
        return gdn_decode.delta_step(x["mixed"], x["z"], x["b"], x["a"], rec, slots, x["A_log"], x["dt_bias"],
                                     x["norm_w"], num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, eps=EPS,
                                     nv=nv, num_warps=warps)

    s0 = states(bsz, seed=7)
    ref_state = s0.clone()
    ref_out = step(ref_state, 1, 8)
    nbytes = s0.numel() * 4
    copies = [states(bsz, seed=100 + i) for i in range(copies_for(nbytes))]
    floor_us = 2 * nbytes / (gbps * 1e9) * 1e6
    rows = []
    for nv, warps in candidates():
        state = s0.clone()
        out = step(state, nv, warps)  # eager first: the ticket counters exist before any capture
        torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-6)
        ulps = float(((out.float() - ref_out.float()).abs() / (ref_out.float().abs().clamp_min(1e-3) * 2**-7)).max())
        if ulps > 2.0:
            raise AssertionError(f"delta_step nv={nv} warps={warps} batch {bsz}: output {ulps:.1f} BF16 ulps off")
        us = 1e3 * rotated(lambda rec, nv=nv, warps=warps: step(rec, nv, warps), copies)
        rows.append({"batch": bsz, "nv": nv, "warps": warps, "us": us, "floor_us": floor_us,
                     "share_of_floor": floor_us / us,
                     "rule": nv == rule[0] and warps == (8 if nv == 1 else 4)})
        if show is not None:
            show(rows[-1])
    return rows


def _line(r: dict) -> str:
    return (f"{r['batch']:>5} {r['nv']:>3} {r['warps']:>5} {r['us']:8.2f} {r['floor_us']:9.2f} "
            f"{r['share_of_floor']:8.1%}{'  <- the rule' if r['rule'] else ''}")


def main(argv=None) -> None:
    a, show = sweep_cli("tools.tune.delta_sweep", __doc__, argv, {}, _line,
                        f"{'batch':>5} {'nv':>3} {'warps':>5} {'us':>8} {'floor us':>9} {'of floor':>8}")
    gbps = read_bandwidth_gbps()
    rows = [r for bsz in map(int, a.batches.split(",")) for r in sweep(bsz, gbps, show)]
    if show:
        for bsz, best in fastest_by_batch(rows).items():
            print(f"batch {bsz}: fastest nv={best['nv']} warps={best['warps']} {best['us']:.2f} us")
    print(json.dumps({"delta_sweep": rows, "read_gb_s": gbps, **environment()}))


if __name__ == "__main__":
    main()
