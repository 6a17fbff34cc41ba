"""The files a CI job reads after `gate` or `compare`: JUnit XML, the report as Markdown (a PR body) and
a commit-status body, each written atomically; a file that cannot be written is named in the error
(the run itself is recorded either way)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import typer

from orchestrator.record import Record

JUNIT = typer.Option(None, "--junit", metavar="FILE",
                     help="write a JUnit XML file: a testcase per suite, per failed check, per pin or cell")
STATUS = typer.Option(None, "--commit-status", metavar="FILE",
                      help="write the commit-status body (state, description, target_url, context) to post as is")
REPORT_URL = typer.Option(None, "--report-url", metavar="URL",
                          help="where the reports are served; the status's target_url is URL/<report file>")


def write(record: Record, junit: Optional[Path], status: Optional[Path], report_url: Optional[str],
          markdown: Optional[Path] = None, markdown_text: Callable[[Record], str] | None = None) -> None:
    """Write each file asked for; OSError names the option and the file."""
    from orchestrator.report.ci import commit_status, junit_xml
    from orchestrator.report.render import write_atomic
    files = [("--junit", junit, lambda: junit_xml(record)),
             ("--commit-status", status, lambda: json.dumps(commit_status(record, report_url)) + "\n"),
             ("--markdown", markdown, lambda: (markdown_text or _markdown)(record))]
    for option, path, text in files:
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text())
        except OSError as e:
            raise OSError(f"{option} {path}: cannot write: {e.strerror or e} (the run is recorded: {record.run_id})") from None


def _markdown(record: Record) -> str:
    """The report as a PR body: a comparison's own (report/compare.py), else the run's."""
    from orchestrator.report import compare, render
    return compare.markdown(record) if record.kind == "compare" else render.render_markdown(record)
