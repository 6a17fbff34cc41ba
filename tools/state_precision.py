"""`python -m tools.state_precision`: what storing the Gated DeltaNet recurrent state in FP16 (the
engine option recurrent_state=fp16; its maths stay FP32) does to the logits, against the FP32 oracle.

Issue 54 asks for the state's precision measured against the oracle margins before any change of
it: at batch 64 on the 27b shape the FP32 state is 19.7 of 34.8 GB a step. On the CPU backend (FP32
activations, so the state's storage is the one rounding that differs) the engine decodes the same
prompts with an FP32 and an FP16 state, and each run is judged as the sacred suites judge
(gates/suites/support.py): its top-k logits against the oracle's (transformers, FP32, teacher-forced
on the run's own tokens) at every generated position, its tokens by the oracle's top1 - top2 margins,
and the FP16 run against the FP32 one up to their first divergence. (BF16 storage, the same bytes,
was measured with it and dropped: docs/lab/2026-12-07-state-precision.md.)

    python -m tools.state_precision --preset 27b-heads --prompt-len 64 --new 192 [--seqs 3] [--json]

A table for people (stderr with --json) and ONE JSON line. The tolerances that judge the CUDA engine
(gates/suites/test_cuda_engine.py: LOGIT_TOL 0.25 on 27b-4L, 1.0 on tiny) are printed beside the
numbers, so the FP16 state's own share of that budget can be read off.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import typer

SCHEMA_VERSION = 1
CUDA_LOGIT_TOL = {"27b-4L": 0.25, "tiny": 1.0}  # gates/suites/test_cuda_engine.py's, for scale
STATES = ("fp32", "fp16")  # the option recurrent_state's storages, the reference first
DECAYS = [0.9, 0.99, 0.999, 0.9999, 1.0]  # per-step decay of the delta rule alone (recurrence_drift)
STEPS = [64, 256, 1024, 4096]
MARGIN_TOL = 2e-3  # a position whose oracle margin is within this is a near tie (the CPU suites' 2 x 1e-3)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(f"state-precision/{seed}")
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def oracle_errors(oracle, prompt: list[int], ids: list[int], topk: list) -> dict:
    """One run against the oracle, teacher-forced on the run's tokens: per generated position the max
    |our top-k logit - the oracle's logit of the same id|, and the margin verdict of its tokens."""
    from gates.suites.support import judge_margins, oracle_logits

    logits = oracle_logits(oracle, prompt + ids)[len(prompt) - 1:-1]  # the positions that chose ids
    per_pos = [max(abs(v - float(logits[j, i])) for v, i in zip(*topk[j])) for j in range(len(ids))]
    v = judge_margins(ids, logits, MARGIN_TOL)
    return {"max_abs": max(per_pos), "mean_abs": sum(per_pos) / len(per_pos), "per_position": per_pos,
            "failed": len(v.failed), "near_ties": v.undetermined, "positions": v.compared,
            "logit_std": float(logits.std())}


def long_memory(ckpt: Path, seed: int = 0) -> Path:
    """A copy of `ckpt` whose Gated DeltaNet heads remember: the synthesizer's random A_log (0.1..2.8)
    and dt_bias (~1) give every head a decay of at most ~0.2 a step, a state that forgets at once. The
    copy draws them as Qwen3-Next / Mamba2 initialize them: A = U(1, 16) (A_log = log A), and dt_bias =
    softplus^-1(dt) with dt log-uniform in [0.001, 0.1], so the heads' decays exp(-A dt) span ~0.2 to
    ~0.999. Written once beside the original (temp dir, then a rename)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = ckpt.with_name(ckpt.name + "-long-memory")
    if (out / "config.json").is_file():
        return out
    tmp = ckpt.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp)
    g = torch.Generator().manual_seed(seed)
    for f in sorted(tmp.glob("*.safetensors")):
        tensors = load_file(f)
        for name, t in tensors.items():
            if name.endswith("linear_attn.A_log"):
                tensors[name] = (1 + 15 * torch.rand(t.shape, generator=g)).log().to(t.dtype)
            elif name.endswith("linear_attn.dt_bias"):
                dt = torch.exp(torch.empty(t.shape).uniform_(math.log(1e-3), math.log(0.1), generator=g))
                tensors[name] = (dt + torch.log(-torch.expm1(-dt))).to(t.dtype)  # softplus^-1(dt)
        save_file(tensors, f, metadata={"format": "pt"})
    tmp.rename(out)
    return out


def run_arm(ckpt: Path, ps: list[list[int]], new: int, state: str) -> tuple[list[list[int]], list[list]]:
    from engine.engine import Engine
    from engine.options import EngineOptions

    options = EngineOptions(recurrent_state=state)
    eng = Engine(ckpt, backend="cpu", lm_head="packed", max_num_seqs=len(ps), max_model_len=len(ps[0]) + new + 1,
                 options=options)
    assert eng.runner().state.recurrent_states.dtype == options.state_dtype
    out = eng.generate(ps, new)
    return out, [[(t.logits, t.ids) for t in seq] for seq in eng.last_topk]


def _summary(rs: list[dict], new: int) -> dict:
    return {"max_abs": max(r["max_abs"] for r in rs), "mean_abs": sum(r["mean_abs"] for r in rs) / len(rs),
            "failed": sum(r["failed"] for r in rs), "near_ties": sum(r["near_ties"] for r in rs),
            "positions": sum(r["positions"] for r in rs), "logit_std": rs[0]["logit_std"],
            # the error's growth along the decode: the max over the sequences in each quarter of it
            "by_quarter": [max(max(r["per_position"][q * new // 4:(q + 1) * new // 4]) for r in rs) for q in range(4)]}


def measure(preset: str, layers: int | None, seqs: int, prompt_len: int, new: int, seed: int,
            memory: bool = True, steps: list[int] = STEPS) -> dict:
    """`memory`: on long_memory's copy of the checkpoint (the synthesizer's own decays forget at once)."""
    from gates.suites.support import build_oracle_at, compare_free_running
    from tools.synth.cache import cached_checkpoint

    t0 = time.perf_counter()
    ckpt = cached_checkpoint(preset=preset, naming="modelopt", head="nvfp4", seed=0,
                             **({"layers": layers} if layers else {}))
    if memory:
        ckpt = long_memory(ckpt, seed)
    oracle = build_oracle_at(ckpt)
    ps = prompts(seqs, prompt_len, oracle.config.vocab_size, seed)
    arms = {state: run_arm(ckpt, ps, new, state) for state in STATES}
    return {"schema_version": SCHEMA_VERSION, "kind": "state_precision", "backend": "cpu",
            "params": {"preset": preset, "layers": layers, "seqs": seqs, "prompt_len": prompt_len, "new": new,
                       "seed": seed, "long_memory": memory, "checkpoint": str(ckpt)},
            "arms": {state: _summary([oracle_errors(oracle, p, ids, topk) for p, ids, topk in zip(ps, *run)], new)
                     for state, run in arms.items()},
            # the FP16 run against the FP32 one, per prompt, up to their first divergence
            "against_fp32": {state: [vars(compare_free_running(a, ta, b, tb))
                                     for a, ta, b, tb in zip(*arms["fp32"], *arms[state])] for state in STATES[1:]},
            "recurrence": recurrence_drift(DECAYS, steps, seed=seed),
            "cuda_logit_tol": CUDA_LOGIT_TOL, "wall_s": round(time.perf_counter() - t0, 1)}


def recurrence_drift(decays: list[float], steps: list[int], heads: int = 16, dk: int = 128, dv: int = 128,
                     seed: int = 0) -> list[dict]:
    """The delta rule alone, copies of one state from the same inputs: one kept in FP32, the others
    stored in FP16 after every step (loaded to FP32, updated, rounded once: what the kernels do
    under the option recurrent_state), at a fixed per-step decay. A synthetic checkpoint's decays are
    whatever its random A_log and dt_bias give; a trained model has long-memory heads (decay near 1),
    where rounding that the decay does not wash out could pile up. Per decay, step count and storage:
    the relative error of the output o = q^T S and of the state, ||x - fp32|| / ||fp32|| over the
    heads. Inputs as the engine's: q, k L2-normalized (q scaled by dk^-1/2), v ~ N(0, 1), beta =
    sigmoid(N(0, 1))."""
    g = torch.Generator().manual_seed(seed)
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    rows = []
    for decay in decays:
        states = {name: torch.zeros(heads, dk, dv, dtype=dtype) for name, dtype in
                  (("fp32", torch.float32), ("fp16", torch.float16))}
        for t in range(1, max(steps) + 1):
            q, k = (torch.nn.functional.normalize(torch.randn(heads, dk, generator=g), dim=-1) for _ in range(2))
            q = q / dk ** 0.5
            v, beta = torch.randn(heads, dv, generator=g), torch.sigmoid(torch.randn(heads, 1, generator=g))
            outs = {}
            for name, stored in states.items():
                s = stored.float() * decay
                s = s + k[:, :, None] * ((v - torch.einsum("hk,hkv->hv", k, s)) * beta)[:, None, :]
                outs[name], states[name] = torch.einsum("hk,hkv->hv", q, s), s.to(stored.dtype)
            if t in steps:
                ref = states["fp32"]
                rows.append({"decay": decay, "steps": t, **{f"{n}_out_rel": rel(outs[n], outs["fp32"]) for n in STATES[1:]},
                             **{f"{n}_state_rel": rel(states[n].float(), ref) for n in STATES[1:]}})
    return rows


def print_table(r: dict, out) -> None:
    p = r["params"]
    cut = "" if p["layers"] is None else f" cut to {p['layers']} layers"
    cut += ", heads of long memory (decays ~0.2..0.999)" if p["long_memory"] else ", the synthesizer's decays"
    print(f"state precision, cpu, {p['preset']}{cut}: "
          f"{p['seqs']} prompts of {p['prompt_len']} tokens, {p['new']} new each", file=out)
    print(f"  {'state':6} {'max |d|':>9} {'mean |d|':>9} {'by quarter of the decode':>36} {'failed':>7} "
          f"{'near ties':>10}  (|d|: top-k logit vs the FP32 oracle; logit std {r['arms']['fp32']['logit_std']:.2f})",
          file=out)
    for name, a in r["arms"].items():
        quarters = " ".join(f"{q:8.5f}" for q in a["by_quarter"])
        print(f"  {name:6} {a['max_abs']:9.5f} {a['mean_abs']:9.5f} {quarters:>36} {a['failed']:7d} "
              f"{a['near_ties']:6d}/{a['positions']}", file=out)
    for name, runs in r["against_fp32"].items():
        for i, f in enumerate(runs):
            where = "identical tokens" if f["diverged_at"] is None else \
                f"first divergence at token {f['diverged_at']} (margin there {f['tie_margin']:.5f})"
            print(f"  prompt {i}: {name} state vs fp32: {where}; max |d| of top-k up to it {f['max_delta']:.5f}",
                  file=out)
    print(f"  for scale, the CUDA suite's LOGIT_TOL: {r['cuda_logit_tol']}", file=out)
    print("  the delta rule alone ([16, 128, 128] heads), FP16-stored state against FP32, relative error of "
          "o = q^T S (of S):", file=out)
    steps = sorted({row["steps"] for row in r["recurrence"]})
    print("  " + f"{'decay':>8} {'':4} " + " ".join(f"{f'{x} steps':>20}" for x in steps), file=out)
    for decay in dict.fromkeys(row["decay"] for row in r["recurrence"]):
        rows = [row for row in r["recurrence"] if row["decay"] == decay]
        for n in STATES[1:]:
            cells = " ".join(f"{x[f'{n}_out_rel']:9.2e} ({x[f'{n}_state_rel']:7.1e})" for x in rows)
            print(f"  {decay:8} {n:4} {cells}", file=out)
    print(f"  wall {r['wall_s']} s", file=out)


@app.command(help="The recurrent state stored in FP16 against FP32, each against the FP32 oracle (CPU).")
def main(preset: str = typer.Option("27b-heads", "--preset"),
         layers: int = typer.Option(0, "--layers", help="Cut the preset to this many layers (0: all)."),
         seqs: int = typer.Option(3, "--seqs"),
         prompt_len: int = typer.Option(64, "--prompt-len"),
         new: int = typer.Option(192, "--new", help="Tokens generated per prompt (>= 4)."),
         seed: int = typer.Option(0, "--seed"),
         memory: bool = typer.Option(True, "--long-memory/--synthetic-decays",
                                     help="Redraw the heads' decays as a trained model's init (long_memory), or "
                                          "keep the synthesizer's, which forget at once."),
         steps: str = typer.Option(",".join(map(str, STEPS)), "--steps",
                                   help="The delta rule alone: the step counts at which its drift is read."),
         as_json: bool = typer.Option(False, "--json", help="Table to stderr, one JSON line to stdout.")) -> None:
    try:
        if not all(x.strip().isdigit() for x in steps.split(",")):
            raise ValueError(f"--steps: expected comma-separated step counts like 64,256, found {steps!r}")
        counts = sorted({int(x) for x in steps.split(",")})
        if seqs < 1 or prompt_len < 1 or new < 4 or layers < 0 or counts[0] < 1:
            raise ValueError(f"need --seqs >= 1, --prompt-len >= 1, --new >= 4, --layers >= 0, --steps >= 1; got "
                             f"{seqs}, {prompt_len}, {new}, {layers}, {steps!r}")
        r = measure(preset, layers or None, seqs, prompt_len, new, seed, memory, counts)
    except ValueError as e:
        typer.echo(f"state_precision: {e}", err=True)
        raise typer.Exit(2)
    print_table(r, sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    app(prog_name="python -m tools.state_precision")
