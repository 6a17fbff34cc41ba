"""The CLI's consoles: on a terminal, rich's own width; in a pipe or a log, no wrapping (a report path or
a run id is never split over two lines, a table never squeezed to 80 columns) and no colour codes."""
from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 4096  # wide enough for any line the CLI prints; a table takes only what it needs


def console(stderr: bool = False, **kw) -> Console:
    c = Console(stderr=stderr, soft_wrap=True, **kw)
    return c if c.is_terminal else Console(stderr=stderr, soft_wrap=True, width=PIPE_WIDTH, **kw)
