"""Where a run's wall time went: its phases in the order they ran, read from the record.

The record keeps the times where they were measured: the driver's archive and transfer and the
report in `timings`, the box's lock wait, build(s), marker proof and residency there too, each suite's
and pin's own duration, each grid cell's checkpoint and each leg's wall time per arm. This lays them
out one row each, with what no phase accounts for (`other`: Ray's scheduling, unpacking, the idle
check, the database) so the rows add up to the total. `orchestrator show` and the report print it.

Inside the legs (`leg_insides`): each bench reports its own process's phases (`engine bench`'s
`phases_s`: start, imports, load, warmup, runs, measure); summed over every leg, with what the bench
cannot see (`outside`: the jail's spawn, the interpreter's exit, the GPU memory's release) as the leg
walls less those, they say whether a slow leg is the checkpoint's load, the warm-up or the work.
"""
from __future__ import annotations

from orchestrator.record import Record

# timings keys -> phase names, in the order a run passes them (a gate: lock, build, proof, residency)
BEFORE = (("archive_s", "archive"), ("transfer_s", "transfer"), ("lock_wait_s", "lock wait"),
          ("build_base_s", "build base"), ("build_head_s", "build head"), ("proof_s", "marker proof"),
          ("residency_s", "residency"))


def phases(record: Record) -> list[tuple[str, float]]:
    """(phase, seconds) rows; the last two `other` and `total` when the total is known."""
    t = record.timings or {}
    rows = [(name, float(t[k])) for k, name in BEFORE if _num(t.get(k))]
    if "build_base_s" not in t and _num(t.get("build_s")):  # a gate's one build, after the lock wait
        at = next((i + 1 for i, (n, _) in enumerate(rows) if n == "lock wait"), len(rows))
        rows.insert(at, ("build", float(t["build_s"])))
    rows += [(f"suite {s.name}", float(s.duration_s)) for s in record.suites
             if s.state != "NOT_RUN" and _num(s.duration_s)]
    pins = [p.duration_s for p in record.mutations if _num(p.duration_s)]
    if pins:
        rows.append((f"mutation pins ({len(pins)})", float(sum(pins))))
    rows += _grid_rows(record.grid)
    if _num(t.get("report_s")):
        rows.append(("report", float(t["report_s"])))
    if _num(t.get("total_s")):
        total = float(t["total_s"])
        rows += [("other", max(0.0, total - sum(s for _, s in rows))), ("total", total)]
    return rows


def _grid_rows(grid: dict | None) -> list[tuple[str, float]]:
    rows = []
    for cell in (grid or {}).get("cells") or []:
        label = (cell.get("cell") or {}).get("label") or "cell"
        if _num(cell.get("checkpoint_s")):
            rows.append((f"checkpoint {label}", float(cell["checkpoint_s"])))
        order = [arm for leg in cell.get("orders") or [] for arm in leg]
        seen: dict[str, int] = {}
        for arm in order:  # the legs as they ran: wall_s is kept per arm, in its own run order
            walls = ((cell.get("arms") or {}).get(arm) or {}).get("wall_s") or []
            n = seen.get(arm, 0)
            seen[arm] = n + 1
            if n < len(walls) and _num(walls[n]):
                rows.append((f"leg {n + 1} {arm} ({label})", float(walls[n])))
    return rows


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def leg_insides(record: Record) -> tuple[int, list[tuple[str, float]]]:
    """(legs that reported their phases, [(phase, seconds summed over them)...] ending with `outside`);
    (0, []) when no leg did (an older engine's bench, or no grid)."""
    sums: dict[str, float] = {}
    n = walled = 0
    for cell in (record.grid or {}).get("cells") or []:
        for arm in (cell.get("arms") or {}).values():
            for raw, wall in zip(arm.get("raw") or [], arm.get("wall_s") or []):
                ph = (raw or {}).get("phases_s") or {}
                if not ph or not _num(wall):
                    continue
                n, walled = n + 1, walled + float(wall)
                for k, v in ph.items():
                    if _num(v):
                        sums[k] = sums.get(k, 0.0) + float(v)
    if not n:
        return 0, []
    return n, [*sums.items(), ("outside", max(0.0, walled - sum(sums.values())))]
