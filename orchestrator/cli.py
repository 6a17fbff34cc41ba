"""`orchestrator` console script: one module per subcommand, each also callable from Python.

Each module listed in COMMANDS exposes `register(app: typer.Typer)`; the CLI only wires them up.
Exit codes across every subcommand: 0 green, 1 a gate red / pin survived, 2 usage, infrastructure
or provenance error.
"""
from __future__ import annotations

import importlib

import typer

COMMANDS = (
    "orchestrator.commands.gate",  # orchestrator gate
    "orchestrator.commands.compare",  # orchestrator compare
    "orchestrator.commands.runs",  # orchestrator runs / show
    "orchestrator.commands.verdict",  # orchestrator verdict
    "orchestrator.commands.grid",  # orchestrator grid
    "orchestrator.commands.mutate",  # orchestrator mutate
    "orchestrator.commands.report",  # orchestrator report
    "orchestrator.commands.owed",  # orchestrator owed
    "orchestrator.commands.serve",  # orchestrator serve
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="regate: gate a head of an inference engine, measure it, report honestly.")


def _register_all() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.register(app)


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":
    main()
