"""The box harness's process: `python -I -S -m orchestrator.box.main`, started by `driver/launch.py` with
the trusted tree alone (then the installed libraries) on its import path.

Reads one JSON request on stdin (`spec`, `identity`, the received `tarballs`' paths and `fetch_s`,
`harness_dir`), runs the job of the spec's kind (a gate's `job.run_job`, a comparison's
`compare.run_compare_job`) and writes its events to stdout, one JSON line each, the last
`{"event": "result", "parts": <BoxResult JSON>}`. SIGTERM cancels the job (its process groups are
killed) and the result still comes. Anything else that would print goes to stderr, the launcher's log.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path

from orchestrator.box.compare import CompareSpec, run_compare_job
from orchestrator.box.job import JobSpec, run_job
from orchestrator.config import BoxConfig, IdlePolicy

KINDS = {"gate": (JobSpec, run_job), "compare": (CompareSpec, run_compare_job)}


def spec_from_json(data: dict):
    """The spec of `data["kind"]`; fields this harness does not know are dropped (a driver newer than
    the trusted tree), absent ones take their defaults."""
    cls = KINDS[data.get("kind", "gate")][0]
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in data.items() if k in names}
    fields["box"] = _box(fields["box"])
    for k in ("hooks", "hidden"):
        if k in fields and fields[k] is not None:
            fields[k] = tuple(fields[k])
    return cls(**fields)


def _box(data: dict) -> BoxConfig:
    names = {f.name for f in dataclasses.fields(BoxConfig)}
    box = {k: v for k, v in data.items() if k in names}
    box["required_markers"] = tuple(box.get("required_markers") or ())
    if isinstance(box.get("idle"), dict):
        box["idle"] = IdlePolicy(**box["idle"])
    return BoxConfig(**box)


def die_with_launcher() -> None:
    """SIGKILL this process when its launcher (the box's Ray worker) dies, as the job died with the
    worker before it ran in a process of its own: the keeper then reaps the run and frees the lock. A
    launcher that died before this line leaves stdin at end of file: the request does not parse."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main() -> int:
    die_with_launcher()
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a stray print of any module lands in the log, never among the events
    request = json.loads(sys.stdin.read())
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    spec = spec_from_json(request["spec"])
    paths, fetch_s = request["tarballs"], request["fetch_s"]

    def emit(ev: dict) -> None:
        events.write(json.dumps(ev) + "\n")
        events.flush()

    def fetch(i: int = 0) -> tuple[bytes, float]:
        return Path(paths[i]).read_bytes(), fetch_s[i]
    job = KINDS[request["spec"].get("kind", "gate")][1]
    parts = job(spec, request["identity"], fetch, emit, cancel.is_set)
    emit({"event": "result", "parts": parts.to_json()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
