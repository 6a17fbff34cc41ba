"""Split a run record's grid verdicts into what is established and what is owed.

This is the one place that decides which claims a report may make. A direction is established only
when its verdict says `established` and every arm has at least MIN_CLAIM_LEGS legs; a magnitude only
when it is `binding` and its direction is established (a record judged before those rules keeps its
verdict, but the claim is not made from it). Everything else (an
indicated direction, overlapping legs, an owed magnitude) is owed, with the reason and the legs
estimated to settle it. The report, the Markdown body and the owed ledger all read these lists, so
an owed item can never slip under Established in one of them and not the others.
"""
from __future__ import annotations

import hashlib
import re

from grids.verdict import MIN_CLAIM_LEGS
from orchestrator.record import Record
from orchestrator.report.errors import ReportError


def _flat(params: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in params.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def cell_key(cell: dict) -> str:
    """The identity of a grid cell: every parameter (nested ones dotted) sorted, the label left out,
    e.g. `batch=1 checkpoint.preset=27b gen_len=32 prompt_len=128`. The ledger keys rows by it."""
    if not isinstance(cell, dict) or not cell:
        raise ReportError(f"grid cell: expected a non-empty mapping of parameters, found {cell!r}")
    flat = _flat({k: v for k, v in cell.items() if k != "label"})
    return " ".join(f"{k}={flat[k]}" for k in sorted(flat))


HISTORY_DIR = "history"  # under the reports directory: a page per cell (orchestrator/report/history.py)


def page_name(spec: str, key: str) -> str:
    """The file name of the cell's history page: readable, and unique by the hash of spec and key."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{spec}-{key}").strip("-")[:80]
    return f"{slug}-{hashlib.sha256(f'{spec}|{key}'.encode()).hexdigest()[:10]}.html"


def cell_label(cell: dict) -> str:
    """What people call the cell: the spec's label, else its key."""
    return str(cell.get("label") or cell_key(cell))


def grid_cells(record: Record) -> list[dict]:
    """The record's grid cells (grids.runner's JSON), or [] when no grid ran."""
    if not record.grid:
        return []
    cells = record.grid.get("cells")
    if not isinstance(cells, list):
        raise ReportError(f"run {record.run_id}: grid.cells: expected a list, found {type(cells).__name__}")
    return cells


def _arms(verdict: dict, cell: dict) -> dict[str, dict]:
    arms = verdict.get("arms") or {}
    if not arms:  # fall back to the runner's raw legs when the verdict carries no per-arm summary
        arms = {name: {"legs": a.get("legs", [])} for name, a in (cell.get("arms") or {}).items()}
    return arms


def _pair(direction: dict, arms: dict) -> tuple[str, str]:
    """(winner, loser); with no winner, the arms in their recorded order."""
    names = list(arms)
    winner = direction.get("winner")
    if winner in arms and len(names) == 2:
        return winner, next(n for n in names if n != winner)
    padded = names + ["?", "?"]
    return padded[0], padded[1]


def _pct(x) -> str:
    return "?" if x is None else f"{x:.3g}"


def cell_claims(cell: dict) -> tuple[list[dict], list[dict]]:
    """(established, owed) claims of one grid cell; each claim is a plain dict the templates render."""
    key, label = cell_key(cell.get("cell") or {}), cell_label(cell.get("cell") or {})
    verdict = cell.get("verdict")
    if verdict is None:  # an interrupted grid keeps cells no leg reached
        return [], [_unmeasured(cell, key, label)]
    if not isinstance(verdict, dict):
        raise ReportError(f"grid cell {key}: verdict: expected grids.verdict.judge output, found {verdict!r}")
    direction, magnitude = verdict.get("direction") or {}, verdict.get("magnitude") or {}
    arms = _arms(verdict, cell)
    winner, loser = _pair(direction, arms)
    base = {"cell": key, "label": label, "winner": winner, "loser": loser,
            "legs": {name: list(a.get("legs", [])) for name, a in arms.items()},
            "ratio": magnitude.get("ratio"), "ci": magnitude.get("ci"), "p": direction.get("p")}
    established, owed = [], []
    d_state = direction.get("state")
    rule = (verdict.get("policy") or {}).get("rule", "rank")
    few = _too_few_legs(base["legs"])
    if d_state == "established" and few:  # a record judged before the leg minimum: the claim is not made
        d_state, direction = "indicated", {**direction, "reasons": few, "legs_needed": MIN_CLAIM_LEGS}
    if d_state == "established":
        established.append({**base, "what": "direction", "state": d_state,
                            "text": f"{winner} ahead of {loser} (rule {rule}; rank-test p = {_pct(base['p'])})"})
    elif d_state == "indicated":
        owed.append({**base, "what": "direction", "state": d_state, "legs_needed": direction.get("legs_needed"),
                     "reasons": list(direction.get("reasons") or
                                     [f"{winner} ahead in every leg but p = {_pct(base['p'])} is not significant"]),
                     "text": f"{winner} ahead of {loser}, NOT established"})
    else:
        owed.append({**base, "what": "direction", "state": d_state or "missing", "legs_needed": None,
                     "reasons": list(direction.get("reasons") or ["the legs overlap: no winner" if d_state == "none"
                                                                  else "no direction recorded"]),
                     "text": f"no direction between {winner} and {loser}"})
    m_state = magnitude.get("state")
    if m_state == "binding" and d_state != "established":  # by how much presupposes which way
        m_state = "owed"
        magnitude = {**magnitude, "reasons": few + [f"direction not established ({d_state or 'missing'})"],
                     "legs_needed": direction.get("legs_needed")}
    if m_state == "binding":
        established.append({**base, "what": "magnitude", "state": m_state,
                            "text": f"{winner} / {loser} = {_ratio_text(magnitude)}"})
    else:
        reasons = list(magnitude.get("reasons") or ["no binding verdict recorded"])
        owed.append({**base, "what": "magnitude", "state": m_state or "missing", "reasons": reasons,
                     "legs_needed": magnitude.get("legs_needed"),
                     "text": f"{winner} / {loser} = {_ratio_text(magnitude)}, NOT binding"})
    return established, owed


def _too_few_legs(legs: dict[str, list]) -> list[str]:
    return [f"{name} has {len(xs)} leg{'s' if len(xs) != 1 else ''}; any established claim needs at least "
            f"{MIN_CLAIM_LEGS} per arm" for name, xs in legs.items() if len(xs) < MIN_CLAIM_LEGS]


def _unmeasured(cell: dict, key: str, label: str) -> dict:
    arms = _arms({}, cell)
    names = list(arms) + ["?", "?"]
    return {"cell": key, "label": label, "winner": names[0], "loser": names[1], "what": "magnitude",
            "state": "not measured", "legs": {n: list(a["legs"]) for n, a in arms.items()}, "ratio": None,
            "ci": None, "p": None, "reasons": ["no verdict: the grid stopped before this cell was judged"],
            "legs_needed": None, "text": "not measured"}


def _ratio_text(magnitude: dict) -> str:
    ratio, ci = magnitude.get("ratio"), magnitude.get("ci")
    if ratio is None:
        return "?"
    if ci and len(ci) == 2 and None not in ci:
        return f"{ratio:.4f} [95% CI {ci[0]:.4f}, {ci[1]:.4f}]"
    return f"{ratio:.4f}"


def claims(record: Record) -> tuple[list[dict], list[dict]]:
    """(established, owed) over every grid cell of the record, then the gates it owes
    (`gate_claims`); each claim carries where it was measured (`backend`, `gpu`), part of its
    identity in the ledger."""
    established, owed = [], []
    for cell in grid_cells(record):
        backend, gpu = where_measured(record, cell)
        e, o = cell_claims(cell)
        established += [{**c, "backend": backend, "gpu": gpu} for c in e]
        owed += [{**c, "backend": backend, "gpu": gpu} for c in o]
    return established, owed + gate_claims(record)[1]  # a suite that ran is a gate result, not a claim


ANY_GPU = "any"  # a claim any GPU model of its backend can settle (a gate the box could not run)
NO_GPU = "none"
UNKNOWN = "unknown"
# A suite's `needs` entry -> the backend a box must have to run it.
BACKEND_OF_NEED = {"cuda": "cuda"}


def where_measured(record: Record, cell: dict | None) -> tuple[str, str]:
    """(backend, GPU model) a cell's legs were measured on: the arms' backend when the grid recorded
    it (a CPU grid can run on a GPU box), else the box's; the GPU model only for a CUDA measurement."""
    box = record.box
    arm_backends = {((a or {}).get("options") or {}).get("backend") for a in ((cell or {}).get("arms") or {}).values()}
    backend = arm_backends.pop() if len(arm_backends) == 1 and None not in arm_backends else None
    backend = backend or box.backend or UNKNOWN
    gpu = (box.gpu or UNKNOWN) if backend == "cuda" else NO_GPU
    return backend, gpu


def gate_claims(record: Record) -> tuple[list[dict], list[dict]]:
    """(ran, owed) for the suites that need a backend: one this box lacked is owed ("CUDA gates not
    run on <sha>", the seed's "CUDA re-run owed") until a run of the same head on a box of that
    backend runs it; one this box ran settles it, whatever its state (a red one fails that run)."""
    box = record.box
    sha = (record.head.sha or "?")[:12]
    ran, owed = [], []
    for s in record.suites:
        for need in s.needs:
            backend = BACKEND_OF_NEED.get(need)
            if backend is None:
                continue
            base = {"what": "gate", "cell": f"suite {s.name}", "label": s.name, "legs": {},
                    "ratio": None, "ci": None, "p": None, "legs_needed": None}
            if s.state == "NOT_RUN" and box.backend != backend:
                owed.append({**base, "backend": backend, "gpu": ANY_GPU, "state": "not run",
                             "reasons": [f"{backend.upper()} gates not run on {sha}: {s.name} needs {need}; "
                                         f"box {box.name or '?'} has backend {box.backend or '?'}"],
                             "text": f"{backend.upper()} re-run owed"})
            elif s.state in ("GREEN", "RED", "TIMEOUT") and box.backend == backend:
                ran.append({**base, "backend": backend, "gpu": box.gpu or UNKNOWN, "state": "ran",
                            "text": f"suite {s.name} ran: {s.state}"})
    return ran, owed


def not_run(record: Record) -> list[dict]:
    """Everything configured but not run, from the record; a non-CUDA box says so plainly."""
    items = [{"what": i.what, "why": i.why} for i in record.not_run]
    if record.state in ("ERROR", "LOST") and not any(str(i["what"]).startswith("the rest of") for i in items):
        done = ", ".join(f"{s.name} {s.state}" for s in record.suites if s.state != "NOT_RUN") or "none"
        last = record.steps[-1] if record.steps else None
        where = f"after its last reported step ({last.step}: {last.status})" if last else "before the box reported a step"
        fate = "its result is unknown" if record.state == "LOST" else "did not run"
        items.append({"what": f"the rest of the {record.kind}",
                      "why": f"the run ended {record.state} {where}; suites finished: {done}; every later step {fate}"})
    for s in record.suites:
        names = {s.name, f"suite {s.name}"}
        if s.state == "NOT_RUN" and not any(i["what"] in names for i in items):
            items.append({"what": f"suite {s.name}", "why": s.why or "not run"})
    mentions_pins = any("mutation" in str(i["what"]) for i in items)
    if not record.mutations and not mentions_pins and record.suites:
        items.append({"what": "mutation pins", "why": "no pin was applied in this gate (mutations: off); "
                                                      "`orchestrator mutate --head REV --all` runs them"})
    grid = record.grid or {}
    if grid and grid.get("complete") is False:
        items.append({"what": f"grid {grid.get('spec', '?')}",
                      "why": "interrupted before its last leg: only the legs it finished are judged"})
    backend = record.box.backend
    mentions_cuda = any("cuda" in f"{i['what']} {i['why']}".lower() for i in items)
    if backend and backend != "cuda" and not mentions_cuda:
        items.append({"what": "no CUDA gate was run", "why": f"this box has no GPU (backend {backend})"})
    return items
