"""`python -m tools.synth --out DIR`: write a synthetic Qwen3.5/3.6 NVFP4 checkpoint (tools/synth/checkpoint.py;
it was `engine make-checkpoint`)."""
from __future__ import annotations

import time
from pathlib import Path

import typer

from tools.synth.checkpoint import make_checkpoint


def make_checkpoint_cmd(
    out: Path = typer.Option(..., "--out", help="Output directory (must not exist, or be empty)."),
    preset: str = typer.Option("tiny", help="tiny | 27b"),
    naming: str = typer.Option("modelopt", help="modelopt | compressed-tensors"),
    head: str = typer.Option("nvfp4", help="nvfp4 | bf16 | tied"),
    seed: int = typer.Option(0),
    layers: int | None = typer.Option(None, help="Cut the preset's depth to this many layers."),
    quant_config: str = typer.Option("legacy", help="legacy (hf_quant_config.json) | inline (ModelOpt only)"),
    prefix: str = typer.Option("model.", help="model. | model.language_model."),
    overwrite: bool = typer.Option(False, help="Replace an existing checkpoint at --out."),
) -> None:
    t0 = time.perf_counter()
    try:
        path = make_checkpoint(out, preset=preset, naming=naming, head=head, seed=seed, layers=layers,
                               quant_config=quant_config, prefix=prefix, overwrite=overwrite)
    except (ValueError, FileExistsError) as e:
        typer.echo(f"make-checkpoint: {e}", err=True)
        raise typer.Exit(2)
    size = sum(f.stat().st_size for f in path.iterdir())
    typer.echo(f"wrote {path} ({size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")


app = typer.Typer(add_completion=False, help="Write a synthetic NVFP4 checkpoint.")
app.command()(make_checkpoint_cmd)
