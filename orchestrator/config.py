"""The orchestrator's configuration: `orchestrator.yaml`, validated once at the edge into frozen dataclasses.

Every key is optional; with no file at all the embedded default is one box named after this host, its
lock at `~/gpu.lock`, and as many GPUs as this machine has (none -> the CPU backend, no required
marker). Runtime discoveries (which node a box is, what a build printed) live elsewhere, never here.
Without a `db_path` (no file, or a file that leaves it out) the database is `regate.db` in the state
directory, found from the cwd as git finds its repository or given by REGATE_HOME
(`orchestrator.state_dir`); without a `reports_dir`, reports go to `reports/` beside the database.

    ray_address: null            # null: start a local Ray in-process; "auto" or "host:port": join
    db_path: .regate/regate.db   # relative paths are relative to the config file's directory
    reports_dir: .regate/reports # absent: reports/ beside db_path
    work_dir: null               # where a box unpacks heads (null: the system temp dir)
    trusted_root: null           # a directory whose gates/, grids/, orchestrator/ judge every head (null: see trusted_ref)
    trusted_ref: null            # a CLI gate's trusted commit (null: origin/HEAD, else the merge-base with main)
    default_box: h200-a          # else the first box
    requeue: 1                   # runs again, this many times, a pool job whose box died and a job the service died under
    timeouts: {schedule_s: 120, lock_s: 3600, build_s: 1800, idle_wait_s: 300, heartbeat_s: 5, stale_s: 120}
    boxes:
      - name: h200-a
        lock_path: ~/gpu.lock    # expanded on the box: the same file people `flock` by hand
        gpus: 1
        required_markers: ["packed NVFP4 W4A16 GEMM: ENABLED"]
        idle: {max_util_pct: 10, on_busy: wait}   # wait (up to timeouts.idle_wait_s) | abort
        isolation: auto          # how a head's processes are confined: auto | bwrap | reaper | none
                                 # (orchestrator/box/sandbox.py; auto: the strongest this box can do)
        pool: h200               # optional: `--pool h200` places a job on any idle box of the pool
                                 # (a pool's boxes must have the same gpus)

A bad file raises `ConfigError` naming the file and the key path, expected against found: types are
checked (`lock_path: null` is refused, not defaulted), timeouts must be finite and > 0, and `db_path`
must name a SQLite database this process can open, or a file it can create (checked at load, so a
bad one is a usage error, exit 2, before anything runs).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from orchestrator.state_dir import DB_NAME, REPORTS, StateDirError, state_dir

CUDA_MARKER = "packed NVFP4 W4A16 GEMM: ENABLED"  # prefix of the line `engine build` prints on a good CUDA build
ON_BUSY = ("wait", "abort")
ISOLATION = ("auto", "bwrap", "reaper", "none")  # orchestrator.box.sandbox.POLICIES


class ConfigError(ValueError):
    """orchestrator.yaml is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class IdlePolicy:
    max_util_pct: float = 10.0  # a GPU above this utilization, or running any compute process, is busy
    on_busy: str = "wait"


@dataclass(frozen=True)
class BoxConfig:
    name: str
    lock_path: str = "~/gpu.lock"
    gpus: int = 0
    required_markers: tuple[str, ...] = ()
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    isolation: str = "auto"
    build_cache: str = "~/.cache/regate/builds"  # compiled kernels, one directory per build key (box/build_cache.py)
    pool: str | None = None  # the pool (e.g. "h100") a `--pool` job may be placed in; boxes of one pool are interchangeable


@dataclass(frozen=True)
class Timeouts:
    schedule_s: float = 120.0  # a box that has not started the job by then is reported, never waited on forever
    lock_s: float = 3600.0
    build_s: float = 1800.0
    idle_wait_s: float = 300.0
    heartbeat_s: float = 5.0  # the driver beats the row, and the box says `alive`, this often
    stale_s: float = 120.0  # a RUNNING row beaten longer ago, at start, is LOST; so is a started box silent this long


@dataclass(frozen=True)
class Config:
    boxes: tuple[BoxConfig, ...]
    ray_address: str | None = None
    db_path: Path = Path(".regate/regate.db")
    reports_dir: Path = Path(".regate/reports")
    work_dir: Path | None = None
    trusted_root: Path | None = None
    trusted_ref: str | None = None  # the commit whose harness judges a CLI gate (driver/harness.py)
    default_box: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    requeue: int = 1  # times the service requeues a pool job whose box died, or a job its previous life ran
    source: str = "<built-in defaults>"

    def box(self, name: str | None) -> BoxConfig:
        name = name or self.default_box or self.boxes[0].name
        for b in self.boxes:
            if b.name == name:
                return b
        known = ", ".join(b.name for b in self.boxes)
        raise ConfigError(f"unknown box {name!r}: {self.source} configures {known}")

    def pool(self, name: str) -> tuple[BoxConfig, ...]:
        """The boxes of pool `name`; ConfigError naming the pool and the known ones when none is."""
        members = tuple(b for b in self.boxes if b.pool == name)
        if not members:
            known = ", ".join(sorted({b.pool for b in self.boxes if b.pool})) or "none"
            raise ConfigError(f"unknown pool {name!r}: {self.source} configures pools: {known}")
        return members

    def target(self, box: str | None, pool: str | None) -> tuple[str, str, BoxConfig]:
        """Where a job goes: (its label, its config digest, the box whose settings the request to Ray
        uses): a named box (or the default one), or a pool (its label `pool:NAME`, its first box: a
        pool's boxes have the same GPUs). ConfigError for an unknown box or pool, or both at once."""
        if pool is None:
            box_cfg = self.box(box)
            return box_cfg.name, self.digest(box_cfg), box_cfg
        if box is not None:
            raise ConfigError(f"give a box or a pool, not both (box {box!r}, pool {pool!r})")
        return pool_label(pool), self.pool_digest(pool), self.pool(pool)[0]

    def pool_digest(self, name: str) -> str:
        """A pool job's config digest: its boxes' own, since any of them may run it."""
        blob = json.dumps(sorted(self.digest(b) for b in self.pool(name))).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]

    def digest(self, box: BoxConfig) -> str:
        """What of the config changes a gate's meaning: the box's settings (not paths or timeouts)."""
        # not where binaries are cached, nor the pool (a name for routing; the box's settings are the meaning)
        settings = {k: v for k, v in asdict(box).items() if k not in ("build_cache", "pool")}
        blob = json.dumps(settings, sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]


def pool_label(pool: str) -> str:
    """What a pool job's box says until a box of the pool starts it (then the box's name)."""
    return f"pool:{pool}"


def host_box_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def default_box(gpus: int) -> BoxConfig:
    return BoxConfig(host_box_name(), gpus=gpus, required_markers=(CUDA_MARKER,) if gpus else ())


def default_config(gpus: int = 0) -> Config:
    """The embedded default: this host as its one box, its state in the state directory."""
    db_path = default_db_path("<built-in defaults>")
    return Config(boxes=(default_box(gpus),), db_path=db_path, reports_dir=db_path.parent / REPORTS)


def load_config(path: str | Path | None, gpus: int = 0) -> Config:
    """The config at `path`, or the embedded default when `path` is None. `gpus`: this host's count,
    used only by the embedded default box."""
    if path is None:
        config = default_config(gpus)
        check_db_path(config.db_path)
        return config
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            raise ConfigError(f"{path}: not a regular file")
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_config({} if raw is None else raw, str(path), path.parent, gpus)


# `schedules` is parsed and validated by orchestrator.schedule.load_schedules (the service's section).
_TOP = ("ray_address", "db_path", "reports_dir", "work_dir", "default_box", "timeouts", "boxes", "trusted_root",
        "trusted_ref", "schedules", "requeue")


def parse_config(raw: object, where: str, base: Path, gpus: int = 0) -> Config:
    top = _mapping(raw, where, "<top level>", _TOP)
    boxes = tuple(_box(b, where, f"boxes[{i}]") for i, b in enumerate(_list(top.get("boxes"), where, "boxes")))
    boxes = boxes or (default_box(gpus),)
    names = [b.name for b in boxes]
    for i, n in enumerate(names):
        if n in names[:i]:
            _fail(where, f"boxes[{i}].name", "a name no other box has", n)
    _check_pools(boxes, where)
    default = _str(top.get("default_box"), where, "default_box", optional=True)
    if default is not None and default not in names:
        _fail(where, "default_box", f"one of the boxes ({', '.join(names)})", default)
    db_path = _path(top.get("db_path"), where, "db_path", base) or default_db_path(where)
    check_db_path(db_path, where)
    return Config(
        boxes=boxes,
        ray_address=_str(top.get("ray_address"), where, "ray_address", optional=True),
        db_path=db_path,
        reports_dir=_path(top.get("reports_dir"), where, "reports_dir", base) or db_path.parent / REPORTS,
        work_dir=_path(top.get("work_dir"), where, "work_dir", base),
        trusted_root=_path(top.get("trusted_root"), where, "trusted_root", base),
        trusted_ref=_str(top.get("trusted_ref"), where, "trusted_ref", optional=True),
        default_box=default,
        timeouts=_timeouts(top.get("timeouts"), where),
        requeue=_count(top.get("requeue", Config.requeue), where, "requeue"),
        source=where,
    )


def default_db_path(where: str) -> Path:
    """The state directory's database; ConfigError (exit 2) when there is no state directory."""
    try:
        return state_dir() / DB_NAME
    except StateDirError as e:
        raise ConfigError(f"{where}: {e}" if where != "<built-in defaults>" else str(e)) from None


def _check_pools(boxes: tuple[BoxConfig, ...], where: str) -> None:
    """A pool job asks Ray for the pool's GPU count before it knows its box: the boxes must agree."""
    first: dict[str, BoxConfig] = {}
    for i, b in enumerate(boxes):
        if b.pool is None:
            continue
        seen = first.setdefault(b.pool, b)
        if b.gpus != seen.gpus:
            _fail(where, f"boxes[{i}].gpus", f"{seen.gpus}, as box {seen.name!r} of pool {b.pool!r} has", b.gpus)


def _name(v, where: str, key: str) -> str:
    """A box or pool name: it becomes a Ray resource (`box:NAME`, `pool:NAME`), hence no ':' or ','."""
    if not isinstance(v, str) or not v or any(c in v for c in " :,"):
        _fail(where, key, "a non-empty name without spaces, ':' or ','", v)
    return v


def _count(v, where: str, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        _fail(where, key, "a whole number >= 0", v)
    return v


def _box(raw: object, where: str, key: str) -> BoxConfig:
    d = _mapping(raw, where, key, tuple(BoxConfig.__dataclass_fields__), required=("name",))
    name = _name(d["name"], where, f"{key}.name")
    pool = None if d.get("pool") is None else _name(d["pool"], where, f"{key}.pool")
    gpus = _count(d.get("gpus", 0), where, f"{key}.gpus")
    markers = tuple(_str(m, where, f"{key}.required_markers[{j}]", optional=True)
                    for j, m in enumerate(_list(d.get("required_markers"), where, f"{key}.required_markers")))
    if "required_markers" not in d and gpus:
        markers = (CUDA_MARKER,)  # a GPU box gates the packed kernel unless told otherwise
    lock = _str(d.get("lock_path", "~/gpu.lock"), where, f"{key}.lock_path")
    isolation = d.get("isolation", BoxConfig.isolation)
    if not isinstance(isolation, str) or isolation not in ISOLATION:
        _fail(where, f"{key}.isolation", f"one of {ISOLATION}", isolation)
    cache = _str(d.get("build_cache", BoxConfig.build_cache), where, f"{key}.build_cache")
    return BoxConfig(name, lock, gpus, markers, _idle(d.get("idle"), where, f"{key}.idle"), isolation, cache, pool)


def _idle(raw: object, where: str, key: str) -> IdlePolicy:
    if raw is None:
        return IdlePolicy()
    d = _mapping(raw, where, key, ("max_util_pct", "on_busy"))
    util = _number(d.get("max_util_pct", IdlePolicy.max_util_pct), where, f"{key}.max_util_pct")
    if util > 100:
        _fail(where, f"{key}.max_util_pct", "a percentage in [0, 100]", util)
    on_busy = d.get("on_busy", IdlePolicy.on_busy)
    if on_busy not in ON_BUSY:
        _fail(where, f"{key}.on_busy", f"one of {ON_BUSY}", on_busy)
    return IdlePolicy(util, on_busy)


def _timeouts(raw: object, where: str) -> Timeouts:
    if raw is None:
        return Timeouts()
    keys = tuple(Timeouts.__dataclass_fields__)
    d = _mapping(raw, where, "timeouts", keys)
    return Timeouts(**{k: _number(v, where, f"timeouts.{k}", positive=True) for k, v in d.items()})


def _mapping(raw, where, key, allowed, required=()) -> dict:
    if not isinstance(raw, dict):
        _fail(where, key, "a mapping", raw)
    for k in required:
        if k not in raw:
            raise ConfigError(f"{where}: {key}: missing key {k!r}")
    for k in raw:
        if k not in allowed:
            raise ConfigError(f"{where}: {key}: unknown key {k!r} (allowed: {', '.join(allowed)})")
    return raw


def _list(v, where, key) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        _fail(where, key, "a list", v)
    return v


def _str(v, where, key, optional=False) -> str | None:
    if (v is not None or not optional) and (not isinstance(v, str) or not v):
        _fail(where, key, "a non-empty string", v)
    return v


def _path(v, where, key, base: Path) -> Path | None:
    s = _str(v, where, key, optional=True)
    return None if s is None else base / Path(s).expanduser()


def _number(v, where, key, positive=False) -> float:
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
            or (positive and v == 0)):
        _fail(where, key, "a finite number > 0" if positive else "a finite number >= 0", v)
    return float(v)


SQLITE_MAGIC = b"SQLite format 3\x00"


def check_db_path(path: Path, where: str = "<built-in defaults>") -> None:
    """db_path names an existing SQLite database we can read and write, or a file we can create: an
    existing regular file starting with SQLite's header (or empty), else a missing file whose nearest
    existing ancestor is a writable directory. ConfigError naming the path otherwise."""
    def bad(why: str):
        raise ConfigError(f"{where}: db_path: {path}: {why}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            bad(f"cannot be created: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            bad(f"cannot be created: {parent} is not writable")
        return
    except OSError as e:  # ENOTDIR (a parent is a file), EACCES, ELOOP, ...
        bad(f"cannot be opened ({e.strerror})")
    if not stat.S_ISREG(st.st_mode):
        bad("expected a SQLite database file, found " + ("a directory" if stat.S_ISDIR(st.st_mode) else
                                                          "something that is not a regular file"))
    if not os.access(path, os.R_OK | os.W_OK):
        bad("cannot be opened for reading and writing (permission denied)")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        bad(f"cannot be read ({e.strerror})")
    if head and head != SQLITE_MAGIC:
        bad("not a SQLite database (its header is not SQLite's)")


def _fail(where: str, key: str, expected: str, found: object):
    raise ConfigError(f"{where}: {key}: expected {expected}, found {found!r}")
