"""Is the box idle? GPUs seen through NVML (pynvml / nvidia-ml-py) when importable, else `nvidia-smi`.

A box without a GPU has nothing to check: the answer is "not applicable", never "idle". Busy means a
compute process other than ours on a visible GPU, or utilization above the box's threshold.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    name: str
    util_pct: float
    pids: tuple[int, ...]  # compute processes on it


def gpus() -> list[GpuState]:
    """Every GPU this process can see (CUDA_VISIBLE_DEVICES honoured); [] when there is none."""
    try:
        found = _nvml()
    except Exception:  # no pynvml, no driver: fall back to the CLI
        found = _smi()
    return visible(found, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(found: list[GpuState], cvd: str | None) -> list[GpuState]:
    if cvd is None:
        return found
    wanted = [s.strip() for s in cvd.split(",") if s.strip()]
    return [g for g in found if str(g.index) in wanted or g.uuid in wanted]


def _nvml() -> list[GpuState]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            pids = tuple(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
            out.append(GpuState(i, _s(uuid), _s(name), float(util), pids))
        return out
    finally:
        pynvml.nvmlShutdown()


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _smi() -> list[GpuState]:
    if shutil.which("nvidia-smi") is None:
        return []
    q = _run(["nvidia-smi", "--query-gpu=index,uuid,name,utilization.gpu", "--format=csv,noheader,nounits"])
    apps = _run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"])
    return parse_smi(q, apps)


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    return r.stdout if r.returncode == 0 else ""


def parse_smi(gpu_csv: str, apps_csv: str) -> list[GpuState]:
    """`nvidia-smi --query-gpu=index,uuid,name,utilization.gpu` and `--query-compute-apps=gpu_uuid,pid`."""
    pids: dict[str, list[int]] = {}
    for line in apps_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            pids.setdefault(parts[0], []).append(int(parts[1]))
    out = []
    for line in gpu_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        util = float(parts[3]) if parts[3].replace(".", "", 1).isdigit() else 0.0
        out.append(GpuState(int(parts[0]), parts[1], parts[2], util, tuple(pids.get(parts[1], ()))))
    return out


def judge(states: list[GpuState], max_util_pct: float, own_pids: set[int]) -> dict:
    """`{"checked", "idle", "detail"}` for the record."""
    if not states:
        return {"checked": False, "idle": None, "detail": "no GPU on this box: idle check not applicable"}
    busy = []
    for g in states:
        others = [p for p in g.pids if p not in own_pids]
        if others:
            busy.append(f"GPU {g.index} runs compute process(es) {others}")
        elif g.util_pct > max_util_pct:
            busy.append(f"GPU {g.index} at {g.util_pct:.0f}% utilization (> {max_util_pct:.0f}%)")
    names = ", ".join(f"{g.index}:{g.name}" for g in states)
    return {"checked": True, "idle": not busy, "detail": "; ".join(busy) or f"idle ({names})"}


def wait_idle(max_util_pct: float, on_busy: str, wait_s: float, emit: Callable[[str], None],
              probe: Callable[[], list[GpuState]] = gpus, poll_s: float = 5.0) -> dict:
    """Check once; when busy and the policy is "wait", re-check until idle or `wait_s` passes."""
    own = {os.getpid()}
    verdict = judge(probe(), max_util_pct, own)
    deadline = time.monotonic() + wait_s
    while verdict["checked"] and not verdict["idle"] and on_busy == "wait" and time.monotonic() < deadline:
        emit(f"box busy ({verdict['detail']}); waiting for it to go idle")
        time.sleep(poll_s)
        verdict = judge(probe(), max_util_pct, own)
    return verdict
