"""`engine info`: what a checkpoint becomes under one backend and lm_head arm — config, census of
NVFP4 weights, the residency table, and peak host RSS / device memory after load and after prepare."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.backends import fp4_gemm_status
from engine.commands.option_flag import engine_options, option_flag
from engine.errors import CheckpointError


def engine_report(model_dir: Path, backend: str, lm_head: str, options=None) -> dict:
    from engine.engine import Engine

    eng = Engine(model_dir, backend=backend, lm_head=lm_head, options=options)
    has_gemm, why = fp4_gemm_status(backend, eng.options.fp4_gemm)
    res = eng.residency()
    res.update(backend=backend, arm=lm_head, fp4_gemm=has_gemm, fp4_gemm_reason=why)
    return {"config": eng.config, "naming": eng.naming, "head_kind": eng.head_kind, "census": eng.census(),
            "residency": res, "memory": eng.memory}


def _mib(n: int) -> str:
    return f"{n / 2**20:10.3f} MiB"


def print_human(report: dict) -> None:
    res, t = report["residency"], report["residency"]["totals"]
    typer.echo(f"naming {report['naming']}  head {report['head_kind']}  backend {res['backend']}  arm {res['arm']}"
               f"  fp4 GEMM {'yes' if res['fp4_gemm'] else 'no (' + res['fp4_gemm_reason'] + ')'}")
    typer.echo(f"census {json.dumps(report['census'])}")
    typer.echo(f"{'weight':44} {'class':5} {'fmt':5} {'N':>7} {'K':>6} {'packed':>14} {'dequant':>14}")
    for r in res["weights"]:
        typer.echo(f"{r['name']:44} {r['class']:5} {r['format']:5} {r['n']:7} {r['k']:6} "
                   f"{_mib(r['packed_bytes'])} {_mib(r['dequant_bytes'])}")
    for cls in ("head", "tower"):
        typer.echo(f"{cls:6} packed {_mib(t[cls]['packed_bytes'])}  resident dequant {_mib(t[cls]['dequant_bytes'])}"
                   f"  kernel operand {_mib(t[cls]['kernel_operand_bytes'])}"
                   f"  checkpoint layout {_mib(t[cls]['checkpoint_layout_bytes'])}  resident {_mib(t[cls]['resident_bytes'])}")
    typer.echo(f"bytes read per decode step {_mib(t['bytes_per_decode_step'])}")
    for when, m in report["memory"].items():
        typer.echo(f"{when:14} peak RSS {_mib(m['peak_rss_bytes'])}  device {_mib(m['device_bytes'])}"
                   f"  peak device {_mib(m['peak_device_bytes'])}")


def info_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory."),
    backend: str = typer.Option("cpu", help="cpu | cuda"),
    lm_head: str = typer.Option("packed", "--lm-head", help="packed | dequant"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line."),
    option: list[str] = option_flag(),
) -> None:
    try:
        report = engine_report(model, backend, lm_head, engine_options(option))
    except (CheckpointError, ValueError, RuntimeError) as e:
        typer.echo(f"info: {e}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(report))
    else:
        print_human(report)


def register(app: typer.Typer) -> None:
    app.command("info", help="Config, NVFP4 census, residency table and memory of a checkpoint.")(info_cmd)
