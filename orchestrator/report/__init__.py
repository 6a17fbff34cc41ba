"""Report side: one self-contained HTML page per run, an index of runs, and a Markdown PR body
(`render`), and the state a run is shown with (`headline`).

Everything renders from the stored run record alone (DESIGN, "Run record"), so any past run can be
re-rendered. What is established and what is owed are decided once, in `claims`. The package imports
nothing itself: a reader imports the module it needs (`orchestrator.report.render`), so no module of
the report imports itself back through this file.
"""
