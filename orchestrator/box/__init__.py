"""Box side: everything that runs on a box, inside its Ray task (`job.run_job`).

`tree` is the one runner of the head's processes (environment, process groups, the last JSON line,
the head's own checkpoint cache) and `keeper` the detached process that holds the box lock until
they are gone; `build`, `lock`, `idle`, `residency`, `suites`, `mutate` and `grid` are the job's steps.
"""
