"""The one shape of a user-facing error, for every command: `orchestrator: error: <message>` on stderr.

One prefix, whatever the command, so a person (or a script grepping a log) finds every error the
same way; the message keeps naming the file, field or value and what was expected. Exit codes are
the CLI's: 2 usage, infrastructure or provenance; 1 red (a command that exits 1 says why itself).
"""
from __future__ import annotations

from typing import NoReturn

import typer

PREFIX = "orchestrator: error: "


def error_line(message: object) -> str:
    return f"{PREFIX}{message}"


def say(message: object) -> None:
    """Print the error line, without exiting (a command with more to print before it exits)."""
    typer.echo(error_line(message), err=True)


def fail(message: object, code: int = 2) -> NoReturn:
    """Print the error line and exit with `code`."""
    say(message)
    raise typer.Exit(code)
