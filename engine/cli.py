"""`engine` console script: one module per subcommand, each also callable from Python.

Each module listed in COMMANDS exposes `register(app: typer.Typer)`; the CLI only wires them up.
"""
from __future__ import annotations

import importlib

import typer

COMMANDS = (
    "engine.commands.info",  # engine info
    "engine.commands.generate",  # engine generate
    "engine.commands.bench",  # engine bench
    "kernels.build",  # engine build
)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="The NVFP4 engine under gate.")


def _register_all() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real missing dependency inside the module: surface it
                raise
            continue
        mod.register(app)


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":
    main()
