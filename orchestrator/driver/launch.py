"""The box end of a job's Ray task: unpack the trusted harness, run it as a process of its own, relay.

This runs inside the box's Ray worker, whose import path is not ours to trust (Ray puts the driver's
directories on it; on a box it is whatever regate is installed there). So it imports nothing of the
box side: it unpacks the harness bundle the driver shipped (`driver/harness.py`) into a directory of
its own, checks its digest against the one the driver recorded, and starts
`python -I -S -m orchestrator.box.main` with exactly that directory (then the installed libraries) on
the import path. The job's spec goes in on stdin as JSON, with the paths of the received tarballs; the
harness's events come back on stdout, one JSON line each, the last one the box's result. A cancel of the
task becomes SIGTERM to the harness, which cancels the job (its process groups die) and answers.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.driver.harness import HarnessError, bundle_digest, files_of
from orchestrator.pyboot import isolated_python

MAIN = "orchestrator.box.main"
STOP_WAIT_S = 60.0  # a cancelled harness kills its process groups, then answers; past this it is killed


def harness_dir(tarball: bytes, digest: str, base: str | None = None) -> Path:
    """The unpacked harness for `digest`, under `base` (default: the temp dir; not the work dir, which
    holds only runs); made once per digest, checked against it at every use (a directory that no
    longer matches is replaced). The job hides it from the head's processes."""
    files = files_of(tarball)
    if bundle_digest(files) != digest:
        raise HarnessError(f"the trusted harness received on the box does not match the driver's digest {digest}")
    root = Path(base or tempfile.gettempdir()) / f"regate-harness-{digest.split(':')[-1][:16]}"
    if root.is_dir() and _on_disk(root, files):
        return root
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    shutil.rmtree(root, ignore_errors=True)
    try:
        tmp.rename(root)
    except OSError:  # another job of the same digest unpacked it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    if not _on_disk(root, files):
        raise HarnessError(f"{root}: the unpacked trusted harness does not match its digest {digest}")
    return root


def _on_disk(root: Path, files: dict[str, bytes]) -> bool:
    try:
        return all((root / rel).read_bytes() == data for rel, data in files.items())
    except OSError:
        return False


def run_harness(spec: dict, identity: dict, tarballs: list[bytes], fetch_s: list[float], harness: bytes,
                digest: str, cancelled: Callable[[], bool]) -> Iterator[dict]:
    """The harness's events, then `{"event": "result", "parts": <BoxResult JSON>}` (an error result when
    the harness could not start or ended without one)."""
    try:
        root = harness_dir(harness, digest)
    except (HarnessError, OSError) as e:
        yield {"event": "result", "parts": {"error": f"the trusted harness could not be set up on the box: {e}"}}
        return
    private = Path(tempfile.mkdtemp(prefix="regate-launch-"))  # 0700: the tarballs and the harness's log
    try:
        yield from _relay(spec, identity, tarballs, fetch_s, root, private, cancelled)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _relay(spec, identity, tarballs, fetch_s, root: Path, private: Path, cancelled) -> Iterator[dict]:
    paths = []
    for i, data in enumerate(tarballs):
        paths.append(str(private / f"tree-{i}.tar"))
        Path(paths[-1]).write_bytes(data)
    request = {"spec": spec, "identity": identity, "tarballs": paths, "fetch_s": fetch_s, "harness_dir": str(root)}
    log = open(private / "harness.log", "w+b")
    proc = subprocess.Popen(isolated_python(sys.executable, [str(root)], "-m", MAIN), cwd=root,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    lines: list[dict] = []
    reader = threading.Thread(target=_read, args=(proc, lines), daemon=True)
    reader.start()
    proc.stdin.write(json.dumps(request).encode())
    proc.stdin.close()
    sent, stopping = 0, None
    try:
        while reader.is_alive() or sent < len(lines):
            if sent < len(lines):
                sent += 1
                yield lines[sent - 1]
                if lines[sent - 1].get("event") == "result":
                    return
                continue
            if stopping is None and cancelled():
                stopping = _stop(proc)
            if stopping is not None and time.monotonic() - stopping > STOP_WAIT_S:
                proc.kill()
            time.sleep(0.05)
        proc.wait()
        log.seek(0)
        tail = "\n".join(log.read().decode(errors="replace").splitlines()[-20:])
        yield {"event": "result", "parts": {"error": f"the box harness exited {proc.returncode} without a result:\n{tail}"}}
    except BaseException:  # Ray's cancel lands here: stop the job, then let the cancel go on
        _stop(proc)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def _read(proc: subprocess.Popen, lines: list[dict]) -> None:
    for raw in proc.stdout:
        try:
            ev = json.loads(raw)
        except ValueError:
            continue  # only the harness writes here; a stray line is not an event
        if isinstance(ev, dict) and "event" in ev:
            lines.append(ev)


def _stop(proc: subprocess.Popen) -> float:
    with suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    return time.monotonic()
