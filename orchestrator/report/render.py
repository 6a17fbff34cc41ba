"""Render a run record to a self-contained HTML page or a Markdown PR body, and the index of runs.

Files are written atomically (temp + rename) so a reader never sees half a report.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import jinja2

from orchestrator.report import claims
from orchestrator.report import headline
from orchestrator.report import live
from orchestrator.report import view
from orchestrator.record import Record
from orchestrator.report.errors import ReportError

_TEMPLATES = Path(__file__).with_name("templates")


def _num(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _bytes(b, signed: bool = False) -> str:
    """Bytes as people compare them: GiB for weights that matter (the seed's 0.666 / 2.368 GiB,
    deltas as -1.70 GiB), MiB or KiB for a tiny checkpoint, so nothing reads as 0.000 GiB."""
    if b is None:
        return "—"
    if b == 0:
        return "0" if not signed else "±0"
    sign = "+" if signed else ""
    for unit, size, digits, floor in (("GiB", 2**30, 2 if signed else 3, 2**30 / 20), ("MiB", 2**20, 1, 2**20),
                                      ("KiB", 2**10, 1, 2**10)):
        if abs(b) >= floor:
            return f"{b / size:{sign}.{digits}f} {unit}"
    return f"{b:{sign}d} B"


def _oneline(text, limit: int = 300) -> str:
    """One line for a Markdown list item or table cell; the HTML page keeps a traceback whole."""
    line = " ".join(str(text or "").split()).replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _env(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update({
        "gib": _bytes,
        "dgib": lambda b: _bytes(b, signed=True),
        "pct": lambda x: "—" if x is None else f"{x:.2%}",
        "num": _num,
        "legs": lambda legs: ", ".join(f"{v:.3f}" for v in legs),
        "ci": lambda ci: "—" if not ci or None in ci else f"[{ci[0]:.4f}, {ci[1]:.4f}]",
        "secs": lambda s: "—" if s is None else f"{s:.1f} s",
        "ms": lambda x, digits=4: "—" if x is None else f"{x:.{digits}f}",
        "dms": lambda x: "—" if x is None else f"{x:+.4f}",
        "data_uri": view.data_uri,
        "oneline": _oneline,
    })
    return env


_HTML, _MD = _env(True), _env(False)


def report_name(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(run_id)) + ".html"


def write_atomic(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a report is for anyone who can reach the directory
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def html(record: Record | dict, owed: list[dict] | None = None) -> str:
    """The run's page; a run that has not ended carries the poller (`live.SCRIPT`), written verbatim so
    its CSP hash (`live.SCRIPT_SOURCE`) matches."""
    return _HTML.get_template("run.html.j2").render(v=view.build(record, owed), live_js=live.SCRIPT)


def render_run(record: Record | dict, reports_dir, owed: list[dict] | None = None) -> Path:
    """Write `<reports_dir>/<run_id>.html`; `owed` = the open ledger items for the run's head."""
    record = view.record_of(record)
    text = html(record, owed)
    return write_atomic(Path(reports_dir) / report_name(record.run_id), text)


def _index_row(record: Record | dict, reports_dir: Path, ledger: list[dict] | None, served: bool) -> dict:
    r = view.record_of(record)
    # Served, every run has a page (the server renders it, live for a running one); on disk, the
    # sibling page when it is there (the index lives beside the pages), else where the run wrote it.
    path, sibling = r.report_path, report_name(r.run_id)
    link = (sibling if served or (reports_dir / sibling).is_file()
            else os.path.relpath(path, reports_dir) if path else None)
    return {"run_id": r.run_id, "state": r.shown_state, "cls": headline.state_class(r), "link": link,
            "sha": (r.head.sha or "")[:12], "rev": r.head.rev, "box": r.box.name, "kind": r.kind,
            "date": view.when(r.created_at) or "", "error": r.error, **_counts(r, ledger)}


def _counts(record: Record, ledger: list[dict] | None) -> dict:
    """What the run did not run and what it left owed (the same lists its report shows), and, from the
    owed ledger, how many items it opened or last found owed are still open. None while it runs."""
    if record.state in live.LIVE_STATES:
        return {"not_run": None, "owed": None, "open": None, "not_run_what": ""}
    try:
        skipped, owed = claims.not_run(record), claims.claims(record)[1]
    except ReportError:  # a record whose grid is not one: its own page says why; the index goes on
        return {"not_run": None, "owed": None, "open": None, "not_run_what": "unreadable grid"}
    mine = (None if ledger is None
            else sum(record.run_id in (o.get("opened_by"), o.get("last_seen_by")) for o in ledger))
    return {"not_run": len(skipped), "owed": len(owed), "open": mine,
            "not_run_what": "; ".join(str(n["what"]) for n in skipped)}


def index_html(records: list[Record | dict], reports_dir, owed: list[dict] | None = None,
               served: bool = False) -> str:
    """The index of runs, newest first; `owed`: the open owed-ledger items (every head); `served`: as the
    HTTP front serves it (every run linked to the page the server renders)."""
    reports_dir = Path(reports_dir)
    rows = sorted((_index_row(r, reports_dir, owed, served) for r in records), key=lambda r: r["date"],
                  reverse=True)
    return _HTML.get_template("index.html.j2").render(rows=rows, ledger=owed is not None)


def render_index(records: list[Record | dict], reports_dir, owed: list[dict] | None = None) -> Path:
    """Write `<reports_dir>/index.html`: every run, newest first."""
    return write_atomic(Path(reports_dir) / "index.html", index_html(records, reports_dir, owed))


def render_markdown(record: Record | dict, owed: list[dict] | None = None) -> str:
    """The report as a PR body: Measured, Established, Owed, Not run."""
    return _MD.get_template("run.md.j2").render(v=view.build(record, owed, with_plots=False))
