"""`python -m tools.ablation --ablate PARTS`: `engine bench` of an engine with parts removed.

    python -m tools.ablation --ablate norm+tower:read --model DIR --backend cuda [--lm-head packed]
                             [--batch B] [--prompt-len P] [--gen-len G] [--iters N] [--warmup W]
                             [--option KEY=VALUE ...] [--json]

The bench's record and table (engine/commands/bench.py), its "ablated" naming the parts; the table
starts with ABLATED. Refused, exit 2: an unknown part or mode, a part this engine does not run as a
kernel, and a part whose launches never ran in the timed runs (nothing of it was measured)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from engine.commands.option_flag import engine_options, option_flag
from engine.errors import CapacityError, CheckpointError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command(help="Decode throughput of one arm with the parts of --ablate removed (timing only).")
def ablation_bench(
    ablate: str = typer.Option(..., "--ablate", help="Parts, joined by '+', each with an optional :free|:empty|:read "
                                                     "(tools/ablation/__init__.py)."),
    model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
    backend: str = typer.Option("cuda", help="cpu | cuda"),
    lm_head: str = typer.Option("packed", "--lm-head", help="packed | dequant"),
    batch: int = typer.Option(1, "--batch"),
    prompt_len: int = typer.Option(16, "--prompt-len"),
    gen_len: int = typer.Option(16, "--gen-len"),
    iters: int = typer.Option(3, "--iters"),
    warmup: int = typer.Option(1, "--warmup"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Table to stderr, one JSON line to stdout."),
    option: list[str] = option_flag(),
) -> None:
    from engine.commands.bench import print_table, run_bench
    from tools.ablation.parts import Ablation

    try:
        options = engine_options(option)
        ablation = Ablation(ablate, options.kernels)
        result = run_bench(model, backend, lm_head, batch, prompt_len, gen_len, iters, warmup, seed,
                           options=options, substitute=ablation)
        unused = ablation.unused()
        if unused:
            raise ValueError(f"--ablate {ablation}: {', '.join(unused)} never ran in this engine ({backend}, the "
                             f"{lm_head} arm), so nothing of it was timed")
    except (CheckpointError, CapacityError, ValueError, RuntimeError) as e:
        typer.echo(f"ablation: {e}", err=True)
        raise typer.Exit(2)
    print_table(result, sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(result), flush=True)
