"""`engine bench`: decode throughput of one arm in one process — warm-up, then N timed runs.

Prints a table for people (stderr when --json) and ONE JSON line for machines (schema_version 1):
decode_tok_s (median over iterations) and every iteration's, ms_per_step, prefill_ms (median) and every
iteration's (the first of a shape runs eagerly, its second captures a graph: engine/prefill_graphs.py), peak host
RSS, peak device memory, bytes_per_decode_step (from the residency table) and achieved GB/s, and
metadata captured automatically, and `phases_s`: where the process's own wall time went (start: from the
process's birth to the bench, Python and the CLI; imports: torch and the engine; load: the checkpoint read,
placed and prepared; warmup; runs; measure: residency, the box's read bandwidth, memory), so a leg's record
says what made it slow. Prompts are synthetic token ids drawn from `--seed`, the same every run;
with `--one-off-prompts` each run's (warm-up included) are new and one token shorter than the run's
before, so no prefill repeats a shape asked for before: the prefill a user's new prompt gets.
"""
from __future__ import annotations

import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import typer

from engine.commands.option_flag import engine_options, option_flag
from engine.errors import CapacityError, CheckpointError

SCHEMA_VERSION = 1


def synthetic_prompts(batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(batch)]


def run_prompts(batch: int, prompt_len: int, vocab: int, seed: int, run: int, one_off: bool) -> list[list[int]]:
    """Run `run`'s prompts (warm-up runs first, from 0): the same each run, or with `one_off`, drawn
    anew at prompt_len - run tokens."""
    if not one_off:
        return synthetic_prompts(batch, prompt_len, vocab, seed)
    return synthetic_prompts(batch, prompt_len - run, vocab, seed + run)


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def git_state(cwd: Path) -> dict:
    """{"head_sha", "tree_dirty"} of the checkout holding `cwd`: tree_dirty is True when tracked files
    differ from HEAD, so a record measured on a copied tree (a GPU box gets the working tree, not the
    commit) does not pass for HEAD's code; None where git cannot say."""
    sha = _run(["git", "rev-parse", "HEAD"], cwd)
    if sha is None:
        return {"head_sha": None, "tree_dirty": None}
    try:  # porcelain status re-reads the files, so it sees content that differs under a stale index
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                            text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {"head_sha": sha, "tree_dirty": None}
    return {"head_sha": sha, "tree_dirty": None if st.returncode else bool(st.stdout.strip())}


def collect_meta(backend: str) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    # The REGATE_* variables set in the environment (infrastructure only: the cache, synthesis threads;
    # the engine's switches are its options, the record's "options").
    switches = {k: v for k, v in sorted(os.environ.items()) if k.startswith("REGATE_")}
    meta = {"host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton_version, "gpu": None, "driver": None, "switches": switches,
            **git_state(Path(__file__).resolve().parent)}
    if backend == "cuda" and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        meta["driver"] = driver.splitlines()[0] if driver else None
    return meta


def since_process_start() -> float | None:
    """Seconds since this process was born (Linux: its start time in /proc against the boot clock);
    None where that is not readable."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        born = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - born)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def run_bench(model: Path, backend: str, lm_head: str, batch: int, prompt_len: int, gen_len: int, iters: int,
              warmup: int, seed: int, one_off: bool = False, options=None, substitute=None) -> dict:
    """`options`: EngineOptions (None: the defaults); the record carries them, flat, as "options".
    `substitute`: the Engine's timing hook (tools/ablation); the record names it as "ablated"."""
    started, t = since_process_start(), time.perf_counter()
    phases: dict[str, float | None] = {"start": None if started is None else round(started, 3)}

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases[name], t = round(now - t, 3), now

    import torch

    from engine.backends import fp4_gemm_status
    from engine.engine import Engine
    from engine.floor import decode_floor_bytes, read_bandwidth
    from engine.linear import head_on_fp4_gemm
    from engine.memory import memory_snapshot
    lap("imports")

    if gen_len < 2 or batch < 1 or prompt_len < 1 or iters < 1 or warmup < 0:
        raise ValueError(f"need batch >= 1, prompt-len >= 1, gen-len >= 2 (decode steps), iters >= 1, "
                         f"warmup >= 0; got {batch}, {prompt_len}, {gen_len}, {iters}, {warmup}")
    if one_off and prompt_len < warmup + iters:
        raise ValueError(f"--one-off-prompts shortens each run's prompts by a token: prompt-len {prompt_len} must "
                         f"be >= warmup + iters = {warmup + iters}")
    eng = Engine(model, backend=backend, lm_head=lm_head, max_num_seqs=max(batch, 1),
                 max_model_len=prompt_len + gen_len, options=options, substitute=substitute)
    lap("load")
    has_gemm, why = fp4_gemm_status(backend, eng.options.fp4_gemm)
    on_gemm = head_on_fp4_gemm(eng.model)
    if backend == "cuda" and lm_head == "packed" and not on_gemm:
        raise RuntimeError(f"the packed arm on cuda would run its lm_head on a BF16 operand (no fp4 GEMM: "
                           f"{why or 'the head is not an NVFP4 Linear on it'}); a packed leg measured that way "
                           "is the dequant arm under another name, so no number is reported")
    vocab = eng.model.config.vocab_size
    for i in range(warmup):
        eng.generate(run_prompts(batch, prompt_len, vocab, seed, i, one_off), gen_len)
    lap("warmup")
    runs = []
    for i in range(warmup, warmup + iters):
        stats: dict = {}
        eng.generate(run_prompts(batch, prompt_len, vocab, seed, i, one_off), gen_len, stats=stats)
        runs.append(stats)
    lap("runs")
    tok_s = [r["decode_tokens"] / r["decode_s"] for r in runs]
    ms_step = statistics.median(1000 * r["decode_s"] / r["decode_steps"] for r in runs)
    step_bytes = eng.residency()["totals"]["bytes_per_decode_step"]
    floor = decode_floor_bytes(eng.model.config, batch, prompt_len, gen_len, step_bytes, eng.model.dtype.itemsize,
                               eng.runner().state.recurrent_states.element_size())
    bandwidth = read_bandwidth(eng.device)
    floor["box_read_gb_s"] = bandwidth["gb_s"]
    floor["floor_ms"] = floor["total_bytes"] / bandwidth["gb_s"] / 1e6
    floor["share_of_floor"] = floor["floor_ms"] / ms_step
    mem = memory_snapshot(eng.device)
    lap("measure")
    return {
        "schema_version": SCHEMA_VERSION, "decode_tok_s": statistics.median(tok_s), "decode_tok_s_iters": tok_s,
        "ms_per_step": ms_step, "prefill_ms": statistics.median(1000 * r["prefill_s"] for r in runs),
        "prefill_ms_iters": [1000 * r["prefill_s"] for r in runs],
        "peak_rss_bytes": mem["peak_rss_bytes"], "peak_device_bytes": mem["peak_device_bytes"],
        "bytes_per_decode_step": step_bytes, "achieved_gb_s": step_bytes / (ms_step / 1000) / 1e9,
        "floor": floor,
        "phases_s": phases,
        "ablated": eng.substituted,  # tools/ablation: timing only, its tokens are wrong (a grid refuses it)
        "options": eng.options.to_json(),  # every engine and kernel switch this leg ran under (engine/options.py)
        "params": {"model": str(model), "backend": backend, "lm_head": lm_head, "batch": batch,
                   "prompt_len": prompt_len, "gen_len": gen_len, "iters": iters, "warmup": warmup, "seed": seed,
                   "one_off_prompts": one_off,
                   "naming": eng.naming, "head_kind": eng.head_kind, "fp4_gemm": has_gemm,
                   "fp4_gemm_reason": why, "head_fp4_gemm": on_gemm, "cuda_graphs": bool(eng.runner().graphs),
                   "prefill_graphs": len(eng.runner().prefill_graphs.graphs) if eng.runner().prefill_graphs else 0,
                   "fused_decode": eng.model.fused is not None, "torch_threads": torch.get_num_threads()},
        "meta": collect_meta(backend),
    }


def print_table(r: dict, out) -> None:
    p = r["params"]
    if r.get("ablated"):
        print(f"ABLATED ({r['ablated']}): timing only, the tokens are wrong", file=out)
    print(f"bench {p['backend']}/{p['lm_head']}  batch {p['batch']}  prompt {p['prompt_len']}  gen {p['gen_len']}",
          file=out)
    for i, v in enumerate(r["decode_tok_s_iters"]):
        print(f"  iter {i}: {v:12.3f} tok/s", file=out)
    print(f"  median {r['decode_tok_s']:.3f} tok/s  {r['ms_per_step']:.3f} ms/step  prefill {r['prefill_ms']:.3f} ms",
          file=out)
    print(f"  {r['bytes_per_decode_step'] / 2**20:.2f} MiB/step -> {r['achieved_gb_s']:.2f} GB/s  peak RSS "
          f"{r['peak_rss_bytes'] / 2**30:.3f} GiB  peak device {r['peak_device_bytes'] / 2**30:.3f} GiB", file=out)
    ph = r.get("phases_s") or {}
    print("  phases " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items() if v is not None), file=out)
    f = r["floor"]
    print(f"  floor {f['total_bytes'] / 2**20:.2f} MiB/step (weights {f['weight_bytes'] / 2**20:.2f}, state "
          f"{f['state_bytes'] / 2**20:.2f}, KV {f['kv_bytes'] / 2**20:.2f}) at {f['box_read_gb_s']:.1f} GB/s read "
          f"(measured here) = {f['floor_ms']:.4f} ms: {100 * f['share_of_floor']:.1f}% of it achieved", file=out)


def bench_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
    backend: str = typer.Option("cpu", help="cpu | cuda"),
    lm_head: str = typer.Option("packed", "--lm-head", help="packed | dequant"),
    batch: int = typer.Option(1, "--batch"),
    prompt_len: int = typer.Option(16, "--prompt-len"),
    gen_len: int = typer.Option(16, "--gen-len"),
    iters: int = typer.Option(3, "--iters"),
    warmup: int = typer.Option(1, "--warmup"),
    seed: int = typer.Option(0, "--seed"),
    one_off: bool = typer.Option(False, "--one-off-prompts",
                                 help="New prompts each run, a token shorter than the last run's (no prefill "
                                      "shape repeats)."),
    as_json: bool = typer.Option(False, "--json", help="Table to stderr, one JSON line to stdout."),
    option: list[str] = option_flag(),
) -> None:
    try:
        result = run_bench(model, backend, lm_head, batch, prompt_len, gen_len, iters, warmup, seed, one_off,
                           engine_options(option))
    except (CheckpointError, CapacityError, ValueError, RuntimeError) as e:
        typer.echo(f"bench: {e}", err=True)
        raise typer.Exit(2)
    print_table(result, sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(result), flush=True)


def register(app: typer.Typer) -> None:
    app.command("bench", help="Decode throughput of one arm (warm-up, then timed runs).")(bench_cmd)
