"""Gate reports: one self-contained HTML page per run, an index of runs, and a Markdown PR body.

Everything renders from the stored run record alone (DESIGN, "Run record"), so any past run can be
re-rendered. What is established and what is owed are decided once, in `claims`.
"""
from orchestrator.report.errors import ReportError
from orchestrator.report.render import render_index, render_markdown, render_run

__all__ = ["ReportError", "render_index", "render_markdown", "render_run"]
