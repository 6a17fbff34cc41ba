"""`engine generate`: greedy continuation of token-id prompts (no tokenizer: ids in, ids out)."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.commands.option_flag import engine_options, option_flag
from engine.errors import CapacityError, CheckpointError


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids: expected comma-separated integers, found {text!r}") from None
    if not ids:
        raise ValueError("--prompt-ids: empty prompt")
    return ids


def generate_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
    prompt_ids: list[str] = typer.Option(..., "--prompt-ids", help="e.g. 1,2,3 (repeat for a batch)."),
    max_new: int = typer.Option(16, "--max-new", min=1),
    lm_head: str = typer.Option("packed", "--lm-head", help="packed | dequant"),
    backend: str = typer.Option("cpu", help="cpu | cuda"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line."),
    option: list[str] = option_flag(),
) -> None:
    from engine.engine import Engine

    try:
        prompts = [parse_ids(p) for p in prompt_ids]
        eng = Engine(model, backend=backend, lm_head=lm_head, options=engine_options(option))
        out = eng.generate(prompts, max_new)
    except (CheckpointError, CapacityError, ValueError, RuntimeError) as e:
        typer.echo(f"generate: {e}", err=True)
        raise typer.Exit(2)
    if as_json:
        topk = [[{"logits": t.logits, "ids": t.ids} for t in seq] for seq in eng.last_topk]
        typer.echo(json.dumps({"prompts": prompts, "tokens": out, "topk": topk, "backend": backend,
                               "lm_head": lm_head}))
    else:
        for p, o in zip(prompts, out):
            typer.echo(f"{','.join(map(str, p))} -> {','.join(map(str, o))}")


def register(app: typer.Typer) -> None:
    app.command("generate", help="Greedy generation from token ids.")(generate_cmd)
