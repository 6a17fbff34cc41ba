"""`orchestrator` console script: one module per subcommand, each also callable from Python.

Each module listed in COMMANDS exposes `register(app: typer.Typer)`; the CLI only wires them up.
Exit codes across every subcommand: 0 green, 1 a gate red / pin survived, 2 usage, infrastructure
or provenance error. Every error reads `orchestrator: error: ...` on stderr (`orchestrator.errors`),
click's own usage errors too (`main`). Help is click's plain layout: typer's rich one prints a type
after every option, `<bool>` after each flag and after --help itself, with no way to turn it off.
"""
from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version as dist_version

import typer

from orchestrator.errors import error_line

COMMANDS = (
    "orchestrator.commands.gate",  # orchestrator gate
    "orchestrator.commands.compare",  # orchestrator compare
    "orchestrator.commands.bisect",  # orchestrator bisect
    "orchestrator.commands.runs",  # orchestrator runs / show
    "orchestrator.commands.history",  # orchestrator history
    "orchestrator.commands.verdict",  # orchestrator verdict
    "orchestrator.commands.grid",  # orchestrator grid
    "orchestrator.commands.mutate",  # orchestrator mutate
    "orchestrator.commands.report",  # orchestrator report
    "orchestrator.commands.owed",  # orchestrator owed
    "orchestrator.commands.serve",  # orchestrator serve
)

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="regate: gate a head of an inference engine, measure it, report honestly.")


def package_version() -> str:
    try:
        return dist_version("regate")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (regate is not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"orchestrator (regate) {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="print regate's version and exit")) -> None:
    pass


def _register_all() -> None:
    for name in COMMANDS:
        importlib.import_module(name).register(app)


# click's exceptions as this typer raises them: typer >= 0.29 carries its own copy of click
# (typer._click), older ones use click itself; BadParameter is public in both and names the module.
_CLICK = sys.modules[typer.BadParameter.__module__]


def main() -> None:
    _register_all()
    command = typer.main.get_command(app)
    try:  # standalone_mode=False: click hands its errors to us instead of printing "Error: ..." itself
        code = command.main(prog_name="orchestrator", standalone_mode=False)
    except _CLICK.UsageError as e:
        _usage_error(e)
    except _CLICK.ClickException as e:  # a bad file argument and the like: no usage line to show
        typer.echo(error_line(e.format_message()), err=True)
        sys.exit(e.exit_code)
    except _ABORT:  # EOF at a prompt
        typer.echo(error_line("aborted"), err=True)
        sys.exit(1)
    except Exception as e:  # a full disk, a bug: infrastructure (exit 2, never the FAILED code), said plainly
        _crashed(e)
    sys.exit(code or 0)


# typer's copy of click has no Abort beside BadParameter; the except tuple is evaluated only while an
# exception is handled, so a missing name there turned every escaping exception into an AttributeError
# and exit 1.
_ABORT = tuple({a for a in (getattr(typer, "Abort", None), getattr(_CLICK, "Abort", None)) if a is not None})


def _crashed(e: Exception) -> None:
    """An exception no command handled: its traceback's tail and the error line on stderr, the JSON
    line on stdout when --json was asked for (a CI job parses it), exit 2."""
    import json
    import traceback

    message = f"internal error: {type(e).__name__}: {e}"
    typer.echo("".join(traceback.format_exception(e, limit=-6)).rstrip(), err=True)
    typer.echo(error_line(message), err=True)
    if "--json" in sys.argv[1:]:
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
        print(json.dumps({"kind": command, "state": "ERROR", "exit_code": 2, "error": message}), flush=True)
    sys.exit(2)


def _usage_error(e) -> None:
    """click's usage line and hint, then the error in the one shape; exit 2. A bare `orchestrator`
    is no error: it prints the help, as before."""
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()
        sys.exit(e.exit_code)
    if e.ctx is not None:
        typer.echo(e.ctx.get_usage(), err=True)
        if e.ctx.command.get_help_option(e.ctx) is not None:
            typer.echo(f"Try '{e.ctx.command_path} {e.ctx.help_option_names[0]}' for help.", err=True)
    typer.echo(error_line(e.format_message()), err=True)
    sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
