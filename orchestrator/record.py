"""The run record: one gate run, typed, versioned, and the one owner of its JSON.

The record is stored whole as JSON in the job ledger (`orchestrator/db.py`), returned by
`GET /api/runs/<id>`, printed by `orchestrator show`, and every report renders from it alone. This
module is its schema: the dataclasses below, `Record.from_json` (which migrates an older stored
record first: `migrate`) and `Record.to_json`. Nothing else reads or writes the record's keys.

JSON keys are the attribute names, except where a field says otherwise (`json=`): the driver's
md5 of the archive is `md5_driver` in the code and `provenance.md5_head` in the JSON, the key every
stored record and `--json` line has carried. Keys this module does not know are kept (`extra`) and
written back, so reading and writing a record never loses a field. `grid` (grids.runner.run_grid's
result) and `residency` (`engine info` readings) are other tools' JSON and stay plain data here.

Versions: 1 (or none) is the record as the dict-building code wrote it; 2 is this module's; 3 adds
the kinds `grid` (a standalone `orchestrator grid`, `driver/standalone_grid.py`) and `compare`
(`orchestrator compare`: a head against a base, its `compare` part) and `head.dirty`, which a
version-2 reader would take for a gate and lose. A record that is not one raises RecordError naming
the run and the field.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 3
# What a run is: a gate (`orchestrator gate`, the service) or a standalone grid (`orchestrator grid`).
Kind = Literal["gate", "grid", "compare"]


class RecordError(ValueError):
    """A stored or given run record that is not one; the message names the field."""


def _opt(json_key: str | None = None, omit_none: bool = False):
    """An optional field (default None) whose JSON key is `json_key` (default: its name);
    `omit_none`: absent from the JSON while None, as the dict-building code wrote it."""
    return field(default=None, metadata={"json": json_key, "omit_none": omit_none})


@dataclass(kw_only=True)
class Part:
    """Base of every part: the keys a reader does not know, kept as they came."""
    extra: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any):
        """The part from its JSON object; RecordError naming the field."""
        return _read(cls, data, cls.__name__, "")

    def to_json(self) -> dict:
        return _write(self)


@dataclass(kw_only=True)
class Head(Part):
    rev: str | None = None
    sha: str | None = None
    repo: str | None = None
    # True: the measured tree had uncommitted changes (or was no git checkout), so its numbers belong
    # to no commit. Absent on gates, whose archive is a commit by construction.
    dirty: bool | None = _opt(omit_none=True)


@dataclass(kw_only=True)
class Box(Part):
    name: str | None = None
    node_id: str | None = None
    gpu: str | None = None  # the GPU model(s), "NVIDIA H200"; None on a box without one
    backend: str | None = None  # "cuda" | "cpu"
    labels: dict | None = _opt(omit_none=True)  # the Ray node's labels


@dataclass(kw_only=True)
class Provenance(Part):
    md5_driver: str | None = _opt(json_key="md5_head")  # md5 of the archive on the driver
    md5_box: str | None = None  # md5 of the bytes the box received
    archive_bytes: int | None = None


@dataclass(kw_only=True)
class Lock(Part):
    path: str | None = None
    wait_s: float | None = None


@dataclass(kw_only=True)
class Idle(Part):
    checked: bool = False
    idle: bool | None = None
    detail: str | None = None


@dataclass(kw_only=True)
class Build(Part):
    markers: list[str] = field(default_factory=list)
    required: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    duration_s: float | None = None
    output_tail: str | None = _opt(omit_none=True)
    proof: dict | None = _opt(omit_none=True)  # marker -> the harness's probe of it (box/marker_proof.py)
    cache: dict | None = _opt(omit_none=True)  # its build directory: {key, dir, warm} (box/build_cache.py)


@dataclass(kw_only=True)
class Sacred(Part):
    ok: bool = True
    accepted: bool = False
    modified: list[str] = field(default_factory=list)
    message: str | None = None


@dataclass(kw_only=True)
class GateChange(Part):
    suite: str | None = None
    what: str | None = None  # dropped | census lowered | needs changed
    detail: str | None = None


@dataclass(kw_only=True)
class GateSetCheck(Part):
    ok: bool = True
    accepted: bool = False
    message: str | None = None
    changes: list[GateChange] = field(default_factory=list)


@dataclass(kw_only=True)
class Failure(Part):
    test: str | None = None
    message: str | None = None


@dataclass(kw_only=True)
class Suite(Part):
    name: str
    state: str  # GREEN | RED | TIMEOUT | NOT_RUN
    sacred: bool = False
    needs: list[str] = field(default_factory=list)
    census_tests: int | None = None
    census_checks: int | None = None
    tests_passed: int | None = None
    tests_total: int | None = None
    checks_passed: int | None = None
    checks_total: int | None = None
    duration_s: float | None = 0.0
    failures: list[Failure] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    sacred_modified: bool = False
    tallies: dict = field(default_factory=dict)  # {name: {count, of}}
    notes: list[str] = field(default_factory=list)
    why: str | None = _opt(omit_none=True)  # why it did not run (NOT_RUN)
    pid: int | None = _opt(omit_none=True)
    output_tail: str | None = _opt(omit_none=True)


@dataclass(kw_only=True)
class Mutation(Part):
    pin: str
    state: str  # KILLED | SURVIVED | STALE | NOT_RUN
    suite: str | None = None
    failures: int | None = None
    expected_min: int | None = None
    detail: str | None = _opt(omit_none=True)
    duration_s: float | None = _opt(omit_none=True)


@dataclass(kw_only=True)
class NotRun(Part):
    what: str
    why: str | None = None


@dataclass(kw_only=True)
class Interrupted(Part):
    at: str | None = None
    why: str | None = None


@dataclass(kw_only=True)
class Live(Part):
    """Where a run stands while it is QUEUED or RUNNING: the last step the box streamed
    (`driver/live.py` stores it); a finished run has none (`db.store` drops it)."""
    step: str | None = None  # build | lock | residency | suite NAME | mutations | grid | grid leg | ...
    status: str | None = None  # start | waiting | done | GREEN | RED | ...
    detail: str | None = None
    at: str | None = None  # when the driver received it (UTC)


@dataclass(kw_only=True)
class Side(Part):
    """One revision of a comparison: what was shipped (driver) and what the box received and built."""
    rev: str | None = None
    sha: str | None = None
    md5_driver: str | None = None
    md5_box: str | None = None
    archive_bytes: int | None = None
    build: Build | None = None


@dataclass(kw_only=True)
class Compare(Part):
    """`orchestrator compare`: the head against its base over one arm config of a grid (the grid's
    cells are in `Record.grid`, its arms named `base` and `head`); `cells` is each cell's outcome
    (grids.regression), `outcome` the run's."""
    base: Side = field(default_factory=Side)
    head: Side = field(default_factory=Side)
    grid: str | None = None  # the spec, as named in the head's tree
    arm: str | None = None  # the spec's arm config both revisions ran
    cells: list[dict] = field(default_factory=list)
    outcome: str | None = None
    # the newest finished gate of each side's commit when the comparison ended: {side: {run_id, state, report}}
    gates: dict | None = _opt(omit_none=True)


@dataclass(kw_only=True)
class BoxResult(Part):
    """The box's part of a run (`box/job.py`), folded into the record on the driver (`Record.merge`)."""
    box: dict = field(default_factory=dict)  # identity from Ray + gpu, backend
    md5_box: str | None = None
    archive_bytes: int | None = None
    versions: dict | None = None
    lock: Lock | None = None
    idle: Idle | None = None
    sacred: Sacred | None = None
    gate_set: GateSetCheck | None = None
    build: Build | None = None
    residency: list | None = None
    suites: list[Suite] = field(default_factory=list)
    mutations: list[Mutation] = field(default_factory=list)
    grid: dict | None = None
    compare: Compare | None = _opt(omit_none=True)  # a comparison's box part (md5s, builds of both sides)
    isolation: dict | None = _opt(omit_none=True)  # how the head's processes were confined (box/sandbox.py)
    not_run: list[NotRun] = field(default_factory=list)
    error: str | None = None
    timings: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class Record(Part):
    """One gate run (DESIGN, "Run record"). Only `run_id` and `state` are required: a run that
    ended early (ERROR before the build) has the rest empty."""
    run_id: str
    kind: Kind = "gate"
    state: str  # QUEUED | RUNNING | PASSED | FAILED | ERROR | LOST
    head: Head = field(default_factory=Head)
    created_at: str | float | None = None
    finished_at: str | float | None = None
    box: Box = field(default_factory=Box)
    provenance: Provenance = field(default_factory=Provenance)
    lock: Lock | None = None
    idle: Idle | None = None
    sacred: Sacred | None = None
    gate_set: GateSetCheck | None = None
    build: Build | None = None
    versions: dict | None = None  # {python, torch, triton, ray}
    suites: list[Suite] = field(default_factory=list)
    mutations: list[Mutation] = field(default_factory=list)
    grid: dict | None = None  # grids.runner.run_grid's result
    residency: list | None = None  # `engine info` residency + {backend, arm, model, checkpoint, memory}, per arm
    not_run: list[NotRun] = field(default_factory=list)
    error: str | None = None
    interrupted: Interrupted | None = _opt(omit_none=True)  # the service stopped under the job
    live: Live | None = _opt(omit_none=True)  # the current step while QUEUED/RUNNING
    # the box's steps as they were reported (lock taken, build done, each suite, ...): what happened,
    # kept when the run ends without the box's result (ERROR, LOST, interrupted) (driver/live.py)
    steps: list[Live] | None = _opt(omit_none=True)
    compare: Compare | None = _opt(omit_none=True)  # kind compare: the base, the head, each cell's outcome
    trusted: dict | None = _opt(omit_none=True)  # the harness that judged: {ref, sha, source, digest, bytes}
    isolation: dict | None = _opt(omit_none=True)  # how the head's processes were confined: {kind, detail}
    timings: dict = field(default_factory=dict)  # {archive_s, transfer_s, build_s, lock_wait_s, ..., total_s}
    report_path: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> "Record":
        """A record from its stored JSON (a dict), migrated to this version; RecordError naming the field."""
        if not isinstance(data, dict):
            raise RecordError(f"run record: expected a JSON object, found {type(data).__name__}")
        where = f"run record {data.get('run_id') or '?'}"
        return _read(cls, migrate(data, where), where, "")

    @classmethod
    def of(cls, value: "Record | dict") -> "Record":
        """`value` itself, or read from its JSON."""
        return value if isinstance(value, Record) else cls.from_json(value)

    def to_json(self) -> dict:
        """The JSON stored and served: `schema_version` first, `shown_state` after `state`."""
        out = {"schema_version": SCHEMA_VERSION, **_write(self)}
        keys = list(out)
        keys.insert(keys.index("state") + 1, "shown_state")
        return {k: self.shown_state if k == "shown_state" else out[k] for k in keys}

    @property
    def suites_not_run(self) -> list[Suite]:
        """The suites that did not run on this box (each with its `why`)."""
        return [s for s in self.suites if s.state == "NOT_RUN"]

    @property
    def is_partial(self) -> bool:
        """PASSED, but a suite of the manifest did not run on this box (orchestrator/report/headline.py)."""
        return self.state == "PASSED" and bool(self.suites_not_run)

    @property
    def full_pass(self) -> bool:
        return self.kind == "gate" and self.state == "PASSED" and not self.is_partial

    @property
    def shown_state(self) -> str:
        """`PASSED (partial: a, b not run on this box)` for a partial pass; a grid that ran to its end
        `DONE (grid only: no gate ran)`, a comparison `<state> (compare: <outcome>)`, neither ever read
        as a gate's pass; the stored state otherwise."""
        if self.kind == "grid" and self.state == "PASSED":
            return GRID_DONE
        if self.kind == "compare" and self.compare is not None and self.compare.outcome:
            return f"{self.state} (compare: {self.compare.outcome})"
        if not self.is_partial:
            return self.state
        return f"PASSED (partial: {', '.join(s.name for s in self.suites_not_run)} not run on this box)"

    def merge(self, part: BoxResult, put_s: float) -> None:
        """Fold the box's part in: box identity, provenance, not_run appended, every other part set,
        the box's timings with `fetch_s` replaced by `transfer_s` (the driver's `ray.put` plus the fetch)."""
        self.box = _read(Box, {**_write(self.box), **part.box}, f"run record {self.run_id}", "box")
        self.provenance.md5_box = part.md5_box or self.provenance.md5_box
        self.provenance.archive_bytes = part.archive_bytes or self.provenance.archive_bytes
        for name in ("versions", "lock", "idle", "sacred", "gate_set", "build", "residency", "suites",
                     "mutations", "grid", "error", "isolation"):
            setattr(self, name, getattr(part, name))
        if part.compare is not None:  # a comparison: the box's halves of both sides
            self.compare = part.compare
        self.not_run.extend(part.not_run)
        self.timings.update({k: v for k, v in part.timings.items() if k != "fetch_s"})
        self.timings["transfer_s"] = round(put_s + part.timings.get("fetch_s", 0.0), 3)


GRID_DONE = "DONE (grid only: no gate ran)"


# Migration: each step takes the JSON of version v to v + 1.

def _v1_to_v2(data: dict) -> dict:
    """Version 1 (the dicts built in driver/gate.py, box/job.py and box/suites.py; no version at all
    before it): a single residency reading could be stored bare instead of in a list."""
    data = dict(data)
    if isinstance(data.get("residency"), dict):
        data["residency"] = [data["residency"]]
    return data


# Version 2 -> 3 changes no field: no `kind` reads as a gate, no `head.dirty` as unknown.
_MIGRATIONS = {1: _v1_to_v2}


def migrate(data: dict, where: str = "run record") -> dict:
    """The record's JSON brought to SCHEMA_VERSION (no version reads as 1); the input is not changed."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise RecordError(f"{where}: schema_version: expected 1..{SCHEMA_VERSION}, found {version!r}")
    data = {k: v for k, v in data.items() if k != "schema_version"}
    for v in range(version, SCHEMA_VERSION):
        data = _MIGRATIONS.get(v, dict)(data)
    data.pop("shown_state", None)  # derived from the suites and the state, never read back
    return data


# Generic reading and writing of the dataclasses above, driven by their type hints.

@functools.cache
def _fields(cls) -> tuple[tuple[str, str, Any, bool, bool], ...]:
    """(attribute, JSON key, type, required, omit_none) per field, `extra` left out."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, f.metadata.get("json") or f.name, hints[f.name], required,
                    bool(f.metadata.get("omit_none"))))
    return tuple(out)


def _read(cls, data: Any, where: str, path: str):
    """`cls` from its JSON object; `where` names the record, `path` the part (`suites[2]`)."""
    if not isinstance(data, dict):
        raise RecordError(f"{where}: {path or 'record'}: expected an object, found {_show(data)}")
    kwargs, known = {}, set()
    for name, key, typ, required, _ in _fields(cls):
        known.add(key)
        sub = f"{path}.{key}" if path else key
        if key in data:
            kwargs[name] = _value(typ, data[key], where, sub)
        elif required:
            raise RecordError(f"{where}: field {sub!r} missing")
    return cls(**kwargs, extra={k: v for k, v in data.items() if k not in known})


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


def _value(typ, value, where: str, path: str):
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is Literal:
        if value not in args or isinstance(value, bool):
            raise RecordError(f"{where}: {path}: expected one of {', '.join(map(str, args))}, found {_show(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for a in inner:
            try:
                return _value(a, value, where, path)
            except RecordError:
                if len(inner) == 1:
                    raise
        raise RecordError(f"{where}: {path}: expected {' or '.join(_name(a) for a in args)}, found {_show(value)}")
    if dataclasses.is_dataclass(typ):
        return _read(typ, value, where, path)
    if origin is list or typ is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: {path}: expected a list, found {_show(value)}")
        return [_value(args[0], v, where, f"{path}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if typ is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: {path}: expected an object, found {_show(value)}")
        return value
    number = typ is float and isinstance(value, int)
    if (not isinstance(value, typ) and not number) or (typ in (int, float) and isinstance(value, bool)):
        raise RecordError(f"{where}: {path}: expected {_SCALARS.get(typ, typ)}, found {_show(value)}")
    return value


def _name(typ) -> str:
    if dataclasses.is_dataclass(typ) or typ is dict:
        return "an object"
    return _SCALARS.get(typ, "a list" if typing.get_origin(typ) is list else str(typ))


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _write(obj) -> dict:
    out = {}
    for name, key, _, _, omit_none in _fields(type(obj)):
        value = getattr(obj, name)
        if value is None and omit_none:
            continue
        out[key] = _plain(value)
    return {**out, **{k: v for k, v in obj.extra.items() if k not in out}}


def _plain(value):
    if dataclasses.is_dataclass(value):
        return _write(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
