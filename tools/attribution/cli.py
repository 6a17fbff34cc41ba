"""`python -m tools.attribution`: where a decode step's time goes, per part, closing on the measured step.

    python -m tools.attribution --model DIR --backend cpu|cuda --lm-head packed|dequant --lengths 8,136 [--batch B]
                     [--compare] [--eager] [--iters N] [--json]

Greedy decode at two lengths, with and without the profiler (tools.attribution.measure): per part
ms per step, share of the step, weight bytes per step and achieved GB/s where the part reads
weights, the closure of the parts on the step timed without the profiler, the profiler's overhead,
and the box's read bandwidth measured in the same command. `--compare` runs both arms and prints
the per-part difference against each part's noise band. A table for people (stderr with --json)
and ONE JSON line for machines.
"""
from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import typer

from engine.commands.option_flag import engine_options, option_flag
from engine.errors import CapacityError, CheckpointError
from engine.linear import HEAD_ARMS

SCHEMA_VERSION = 1


class UsageError(ValueError):
    """A bad option; the message names it and what was expected."""


def parse_lengths(text: str) -> tuple[int, int]:
    """`8,136` -> (8, 136): two increasing generation lengths, each >= 2 (at least one decode step)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--lengths: expected two comma-separated integers like 8,136, found {text!r}") from None
    if len(values) != 2 or values[0] < 2 or values[1] <= values[0]:
        raise UsageError(f"--lengths: expected two increasing integers >= 2 (short,long), found {text!r}")
    return values[0], values[1]


def check_options(backend: str, lm_head: str, batch: int, prompt_len: int, iters: int, warmup: int,
                  threads: int = 0) -> None:
    if backend not in ("cpu", "cuda"):
        raise UsageError(f"--backend: expected cpu or cuda, found {backend!r}")
    if lm_head not in HEAD_ARMS:
        raise UsageError(f"--lm-head: expected one of {', '.join(HEAD_ARMS)}, found {lm_head!r}")
    for name, value, least in (("--batch", batch, 1), ("--prompt-len", prompt_len, 1), ("--iters", iters, 1),
                               ("--warmup", warmup, 0), ("--threads", threads, 0)):
        if value < least:
            raise UsageError(f"{name}: expected an integer >= {least}, found {value}")


def run_attribute(model: Path, backend: str, arms: list[str], lengths: tuple[int, int], batch: int,
                  prompt_len: int, iters: int, warmup: int, seed: int, eager: bool, threads: int = 0,
                  options=None) -> dict:
    """`options`: EngineOptions for every arm's engine (None: the defaults); the record carries them."""
    import torch

    from tools.attribution.measure import attribute_arm
    from engine.floor import read_bandwidth
    from engine.backends import device_for, fp4_gemm_status
    from engine.commands.bench import collect_meta, synthetic_prompts
    from engine.engine import Engine

    if threads:
        torch.set_num_threads(threads)
    records = {}
    for arm in arms:
        # every prompt in one prefill: the measured window is one uninterrupted run of decode steps
        eng = Engine(model, backend=backend, lm_head=arm, max_num_seqs=batch, max_model_len=prompt_len + lengths[1],
                     max_num_batched_tokens=max(batch * prompt_len, prompt_len + lengths[1], 2048),
                     cuda_graphs=False if eager or backend == "cpu" else None, options=options)
        ran_under = eng.options.to_json()
        prompts = synthetic_prompts(batch, prompt_len, eng.model.config.vocab_size, seed)
        records[arm] = attribute_arm(eng, prompts, lengths, iters, warmup)
        del eng  # the next arm loads into the memory this one held
        gc.collect()
        if backend == "cuda":
            torch.cuda.empty_cache()
    bandwidth = read_bandwidth(device_for(backend))
    for r in records.values():
        r["box_read_gb_s"] = bandwidth["gb_s"]
        r["bandwidth_share"] = r["achieved_gb_s"] / bandwidth["gb_s"] if r["achieved_gb_s"] else None
    has_gemm, why = fp4_gemm_status(backend, ran_under["fp4_gemm"])
    out = {"schema_version": SCHEMA_VERSION, "kind": "attribution", "bandwidth": bandwidth,
           "options": ran_under,
           "params": {"model": str(model), "backend": backend, "arms": arms, "lengths": list(lengths),
                      "batch": batch, "prompt_len": prompt_len, "iters": iters, "warmup": warmup, "seed": seed,
                      "eager": eager, "fp4_gemm": has_gemm, "fp4_gemm_reason": why,
                      "torch_threads": torch.get_num_threads()},
           "meta": collect_meta(backend)}
    if len(arms) == 1:
        return {**records[arms[0]], **out}
    return {**out, "arms": records, "difference": difference(records[arms[0]], records[arms[1]])}


def difference(a: dict, b: dict) -> dict:
    """Per part a - b (ms per step), against the part's noise band (the larger spread of the two);
    with one run per length there is no band, and no part is called beyond it."""
    pa, pb = ({p["name"]: p for p in r["parts"]} for r in (a, b))
    banded = a["iters"] >= 2 and b["iters"] >= 2
    rows = []
    for name in [n for n in pa if n in pb] + [n for n in pb if n not in pa] + [n for n in pa if n not in pb]:
        x, y = pa.get(name, {}), pb.get(name, {})
        delta = x.get("ms_per_step", 0.0) - y.get("ms_per_step", 0.0)
        noise = max(x.get("spread_ms", 0.0), y.get("spread_ms", 0.0)) if banded else None
        rows.append({"name": name, "a_ms": x.get("ms_per_step"), "b_ms": y.get("ms_per_step"), "delta_ms": delta,
                     "noise_ms": noise, "beyond_noise": None if noise is None else abs(delta) > noise})
    return {"a": a["arm"], "b": b["arm"], "parts": rows,
            "total_delta_ms": a["total_ms_per_step"] - b["total_ms_per_step"],
            "sum_of_part_deltas_ms": sum(r["delta_ms"] for r in rows)}


def _mib(n) -> str:
    return "" if n is None else f"{n / 2**20:.2f}"


def _num(x, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def print_arm(r: dict, out) -> None:
    print(f"attribute {r['backend']}/{r['arm']}  batch {r['batch']}  prompt {r['prompt_len']}  lengths "
          f"{r['lengths'][0]},{r['lengths'][1]} ({r['steps']} steps)  decode {r['decode']}", file=out)
    print(f"  {'part':16} {'ms/step':>10} {'share':>7} {'spread':>9} {'MiB/step':>10} {'GB/s':>8}", file=out)
    for p in r["parts"]:
        print(f"  {p['name']:16} {p['ms_per_step']:10.4f} {_num(p['share'], '7.1%')} {p['spread_ms']:9.4f} "
              f"{_mib(p.get('bytes_per_step')):>10} {_num(p.get('gb_s'), '8.2f'):>8}", file=out)
    print(f"  {'sum of parts':16} {r['sum_of_parts_ms_per_step']:10.4f}  closure {_num(r['closure'], '.2%')} of the "
          f"step measured without the profiler, {r['total_ms_per_step']:.4f} ms", file=out)
    own = [c for c in r["closure_iters"] if c is not None]
    if own:
        print(f"  closure of each iteration on its own: {min(own):.2%} .. {max(own):.2%} (the box's noise)", file=out)
    print(f"  profiler overhead {_num(r['profiler_overhead'], '+.2%')} (profiled step "
          f"{r['profiled_ms_per_step']:.4f} ms; {_num(r.get('records_per_step'), '.1f')} records a step, "
          f"{_num(r.get('overhead_us_per_record'), '+.3f')} us each)", file=out)
    print(f"  weights {_mib(r['weight_bytes_per_step'])} MiB/step -> {_num(r['achieved_gb_s'], '.2f')} GB/s achieved; "
          f"box read {_num(r.get('box_read_gb_s'), '.2f')} GB/s -> {_num(r.get('bandwidth_share'), '.1%')} of it",
          file=out)
    print(f"  time: {r['time_source']}", file=out)


def print_table(result: dict, out) -> None:
    arms = result.get("arms") or {result["arm"]: result}
    for r in arms.values():
        print_arm(r, out)
    print(f"box read bandwidth {result['bandwidth']['gb_s']:.2f} GB/s ({result['bandwidth']['method']})", file=out)
    d = result.get("difference")
    if not d:
        return
    print(f"difference {d['a']} - {d['b']} (ms/step; noise = the larger spread of the two arms)", file=out)
    words = {None: "no noise band (one run per length)", True: "BEYOND NOISE", False: "within noise"}
    for p in d["parts"]:
        print(f"  {p['name']:16} {_num(p['a_ms'], '10.4f')} {_num(p['b_ms'], '10.4f')} {p['delta_ms']:+10.4f} "
              f"noise {_num(p['noise_ms'], '.4f') or '-'} {words[p['beyond_noise']]}", file=out)
    print(f"  step {d['total_delta_ms']:+.4f} ms measured; parts sum to {d['sum_of_part_deltas_ms']:+.4f} ms", file=out)


def attribute_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
    backend: str = typer.Option("cpu", help="cpu | cuda"),
    lm_head: str = typer.Option("packed", "--lm-head", help="packed | dequant (ignored with --compare)"),
    lengths: str = typer.Option("8,136", "--lengths", help="Two generation lengths, short,long."),
    batch: int = typer.Option(1, "--batch"),
    prompt_len: int = typer.Option(16, "--prompt-len"),
    iters: int = typer.Option(5, "--iters", help="Profiled and unprofiled runs per length."),
    warmup: int = typer.Option(1, "--warmup"),
    seed: int = typer.Option(0, "--seed"),
    compare: bool = typer.Option(False, "--compare", help="Both arms, and the per-part difference."),
    eager: bool = typer.Option(False, "--eager", help="cuda: decode without CUDA graphs."),
    threads: int = typer.Option(0, "--threads", help="cpu: torch threads (0: torch's default). One thread "
                                "keeps a shared box's other load from stalling every op."),
    as_json: bool = typer.Option(False, "--json", help="Table to stderr, one JSON line to stdout."),
    option: list[str] = option_flag(),
) -> None:
    try:
        span = parse_lengths(lengths)
        check_options(backend, lm_head, batch, prompt_len, iters, warmup, threads)
        arms = list(HEAD_ARMS) if compare else [lm_head]
        result = run_attribute(model, backend, arms, span, batch, prompt_len, iters, warmup, seed, eager, threads,
                               engine_options(option))
    except (CheckpointError, CapacityError, ValueError, RuntimeError) as e:
        typer.echo(f"attribute: {e}", err=True)
        raise typer.Exit(2)
    print_table(result, sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(result), flush=True)


app = typer.Typer(add_completion=False, help="Two-length decode attribution: per-part ms per step, closing on the "
                  "step (a tool beside the engine, issue 51; it was `engine attribute`).")
app.command()(attribute_cmd)
