"""The repeatable `--option KEY=VALUE` flag of every engine command that builds an Engine.

One flag, one parser (engine/options.py's EngineOptions.parse), so `engine bench`, `generate`,
`attribute` and `info` accept the same keys with the same errors.
"""
from __future__ import annotations

import typer

from engine.options import EngineOptions

HELP = "An engine option, KEY=VALUE (repeatable; engine/options.py lists the keys and their defaults)."


def option_flag():
    return typer.Option([], "--option", help=HELP)


def engine_options(pairs: list[str] | None) -> EngineOptions:
    """The flag's pairs as EngineOptions; ValueError naming the key on bad input."""
    return EngineOptions.parse(list(pairs or []))
