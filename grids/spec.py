"""Grid specs: typed, frozen configuration loaded once from `grids/*.yaml` and passed down.

A spec names two arms (engine options), the cells to measure (batch, prompt and generation length,
checkpoint), how many legs, warm-up and timed iterations, and the verdict policy. Every error
names the file and the key (`cells[1].batch`) with what was expected against what was found.

    name: lmhead
    backend: cuda                  # default for arms that do not set one
    legs: 3                        # legs run without --until-binding (>= 3 with it: fewer claim nothing)
    max_legs: 8                    # cap for --until-binding
    warmup: 2                      # per bench process
    iters: 5                       # timed decode runs per bench process (one leg of one arm)
    timeout_s: 900                 # per bench process
    verdict: {rule: rank, alpha: 0.05, tolerance: 0.02}   # rule may be spelled direction_rule
    checkpoint: {preset: 27b, layers: 4, naming: modelopt, seed: 0}   # default for every cell
    arms:
      packed: {lm_head: packed}
      dequant: {lm_head: dequant, extra_args: []}
      # an arm may set engine options (engine/options.py): each leg's bench gets --option KEY=VALUE
      #   unmerged: {lm_head: packed, options: {merge_projections: 0}}
    cells:
      - {batch: 1, prompt_len: 128, gen_len: 64}
      - {batch: 16, prompt_len: 128, gen_len: 64, checkpoint: {layers: 8}}
    attribute: {lengths: [8, 136], iters: 3}   # optional: `python -m tools.attribution` per arm per cell, after the legs
    metric: decode   # what a leg measures: decode (default) or prefill tok/s (grids/metric.py)

Bounds (`LIMITS`), far above any real grid, so a typo cannot queue a run that never ends: legs and
max_legs <= 200, warmup <= 100, iters <= 1000, batch <= 1024, prompt_len and gen_len (and the
attribute lengths) <= 131072, layers <= 1024, timeout_s finite, > 0 and <= 86400 (a day per bench
process). An arm's extra_args may not set an option the runner itself sets (`RUNNER_OPTIONS`:
--model, --backend, --lm-head, --batch, --prompt-len, --gen-len, --iters, --warmup, --lengths,
--json); the arm's own keys and the cell say those, and engine options go in the arm's `options`
(checked against engine/options.py when the spec loads; --option in extra_args is refused).

A spec is named by a path relative to the repository root (`grids/smoke.yaml`); `repo_relative`
maps an absolute path inside the repository to that form and refuses one outside it.
"""
from __future__ import annotations

import dataclasses
import re
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grids import metric
from grids.verdict import MIN_CLAIM_LEGS, RULES

LM_HEADS = ("packed", "dequant")
BACKENDS = ("cpu", "cuda")
TOP_KEYS = {"name", "backend", "legs", "max_legs", "until_binding", "warmup", "iters", "timeout_s", "verdict",
            "checkpoint", "arms", "cells", "attribute", "metric"}


LIMITS = {"legs": 200, "warmup": 100, "iters": 1000, "batch": 1024, "prompt_len": 131072, "gen_len": 131072,
          "layers": 1024, "timeout_s": 86400.0}
# Options of `engine bench` / `python -m tools.attribution` that grids.runner and grids.attribution set themselves
# (tests/test_grid_spec.py checks both argument lists against this set).
RUNNER_OPTIONS = ("--model", "--backend", "--lm-head", "--batch", "--prompt-len", "--gen-len", "--iters",
                  "--warmup", "--lengths", "--json", "--option")


class SpecError(ValueError):
    """A grid spec that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Checkpoint:
    """Parameters of `tools.synth.cache.cached_checkpoint` (a synthetic checkpoint)."""
    preset: str = "tiny"
    naming: str = "modelopt"
    head: str = "nvfp4"
    seed: int = 0
    layers: int | None = None
    quant_config: str = "legacy"
    prefix: str = "model."

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Arm:
    name: str
    lm_head: str
    backend: str
    extra_args: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()  # engine options (engine/options.py), sorted: (key, value)

    def option_args(self) -> list[str]:
        """The arm's options as `engine bench` takes them."""
        return [a for k, v in self.options for a in ("--option", f"{k}={v}")]


@dataclass(frozen=True)
class Cell:
    batch: int
    prompt_len: int
    gen_len: int
    checkpoint: Checkpoint

    @property
    def label(self) -> str:
        ck = self.checkpoint
        layers = f"/{ck.layers}L" if ck.layers else ""
        return f"b{self.batch} p{self.prompt_len} g{self.gen_len} {ck.preset}{layers} {ck.naming}"

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "batch": self.batch, "prompt_len": self.prompt_len,
                "gen_len": self.gen_len, "checkpoint": self.checkpoint.params()}


@dataclass(frozen=True)
class Policy:
    rule: str = "rank"
    alpha: float = 0.05
    tolerance: float = 0.02


@dataclass(frozen=True)
class Attribute:
    """Two-length decode attribution of each arm of each cell (`python -m tools.attribution`), run once per cell
    after its legs: generation lengths (short, long) and runs per length."""
    lengths: tuple[int, int] = (8, 136)
    iters: int = 3


@dataclass(frozen=True)
class GridSpec:
    name: str
    arms: tuple[Arm, Arm]
    cells: tuple[Cell, ...]
    legs: int = 3
    max_legs: int = 8
    until_binding: bool = False  # a gate's --grid keeps adding legs up to max_legs
    warmup: int = 1
    iters: int = 3
    timeout_s: float = 900.0
    policy: Policy = field(default_factory=Policy)
    source: str = "<dict>"
    attribute: Attribute | None = None
    metric: str = "decode"  # what a leg measures (grids/metric.py): decode or prefill tok/s

    def with_backend(self, backend: str) -> GridSpec:
        """The same grid with every arm on `backend` (the CLI's --backend)."""
        if backend not in BACKENDS:
            raise SpecError(f"--backend: expected one of {', '.join(BACKENDS)}, found {backend!r}")
        arms = tuple(dataclasses.replace(a, backend=backend) for a in self.arms)
        return dataclasses.replace(self, arms=arms)


def load_spec(path: str | Path) -> GridSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read grid spec: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text: {e}") from e
    return parse_spec_text(text, str(path))


def parse_spec_text(text: str | bytes, source: str) -> GridSpec:
    """A spec from the YAML text of a file (an archive member, say); `source` names it in errors."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise SpecError(f"{source}: not valid YAML: {e}") from e
    return parse_spec(data, source)


def repo_relative(spec: str, repo: str | Path) -> str:
    """`spec` as a path relative to the repository root `repo`: a relative path is taken as relative
    to the root already (normalized); an absolute one must lie inside the repository. A bare name
    (`smoke`) stays as it is. SpecError for a path outside the repository."""
    if not isinstance(spec, str) or not spec or "\x00" in spec:
        raise SpecError(f"grid spec {spec!r}: expected a path or name of a spec in the repository")
    if Path(spec).is_absolute():
        root = Path(repo).resolve()
        try:
            return Path(spec).resolve().relative_to(root).as_posix()
        except ValueError:
            raise SpecError(f"grid spec {spec!r}: outside the repository {root} (give a path inside it, "
                            "or relative to its root: grids/smoke.yaml)") from None
    rel = posixpath.normpath(Path(spec).as_posix())
    if rel == ".." or rel.startswith("../"):
        raise SpecError(f"grid spec {spec!r}: outside the repository (paths are relative to its root)")
    return rel


def parse_spec(data: Any, source: str = "<dict>") -> GridSpec:
    where = _Where(source)
    top = where.mapping(data, "", TOP_KEYS)
    backend = where.choice(top.get("backend", "cpu"), "backend", BACKENDS)
    defaults = where.mapping(top.get("checkpoint", {}), "checkpoint", _checkpoint_keys())
    legs = where.count(top.get("legs", 3), "legs", 1, LIMITS["legs"])
    until_binding = top.get("until_binding", False)
    if not isinstance(until_binding, bool):
        raise where.fail("until_binding", "true or false", until_binding)
    if until_binding and legs < MIN_CLAIM_LEGS:
        raise SpecError(f"{source}: legs: {legs} legs per arm cannot establish a claim (at least "
                        f"{MIN_CLAIM_LEGS} needed); until_binding: true refuses it")
    return GridSpec(
        name=where.text(top.get("name"), "name"),
        arms=_arms(where, top.get("arms"), backend),
        cells=_cells(where, top.get("cells"), defaults),
        legs=legs,
        max_legs=where.count(top.get("max_legs", max(legs, 8)), "max_legs", legs, LIMITS["legs"]),
        until_binding=until_binding,
        warmup=where.count(top.get("warmup", 1), "warmup", 0, LIMITS["warmup"]),
        iters=where.count(top.get("iters", 3), "iters", 1, LIMITS["iters"]),
        timeout_s=where.number(top.get("timeout_s", 900), "timeout_s", LIMITS["timeout_s"]),
        policy=_policy(where, top.get("verdict", {})),
        source=source,
        attribute=None if top.get("attribute") is None else _attribute(where, top["attribute"]),
        metric=where.choice(top.get("metric", metric.DEFAULT), "metric", metric.METRICS),
    )


def _checkpoint_keys() -> set[str]:
    return {f.name for f in dataclasses.fields(Checkpoint)}


def _arms(where: _Where, data: Any, backend: str) -> tuple[Arm, Arm]:
    arms = where.mapping(data, "arms", None)
    if len(arms) != 2:
        raise SpecError(f"{where.source}: arms: expected exactly 2 arms, found {len(arms)}")
    out = []
    for name, body in arms.items():
        key = f"arms.{name}"
        body = where.mapping(body, key, {"lm_head", "backend", "extra_args", "options"})
        extra = body.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(x, (str, int, float)) for x in extra):
            raise SpecError(f"{where.source}: {key}.extra_args: expected a list of strings, found {extra!r}")
        taken = next((x for x in map(str, extra) if x.split("=", 1)[0] in RUNNER_OPTIONS), None)
        if taken is not None:
            raise SpecError(f"{where.source}: {key}.extra_args: {taken!r} sets an option the runner sets itself "
                            f"({', '.join(RUNNER_OPTIONS)}); set lm_head/backend on the arm and the rest on the cell")
        out.append(Arm(name=str(name),
                       lm_head=where.choice(body.get("lm_head"), f"{key}.lm_head", LM_HEADS),
                       backend=where.choice(body.get("backend", backend), f"{key}.backend", BACKENDS),
                       extra_args=tuple(str(x) for x in extra),
                       options=_options(where, body.get("options", {}), f"{key}.options")))
    return out[0], out[1]


OPTION_KEY = re.compile(r"[a-z][a-z0-9_]*")


def _options(where: _Where, data: Any, key: str) -> tuple[tuple[str, str], ...]:
    """An arm's engine options as sorted (key, value text) pairs. Their form is checked here (a key
    as engine/options.py spells one, a scalar or a list of them); what each means is the head's
    engine's to check (`engine bench --option` refuses an unknown key or a bad value, naming it, and
    the leg fails with that message): the grid runs on the box's trusted side, which imports no
    engine of any tree."""
    body = where.mapping(data, key, None)
    for k, v in body.items():
        if not isinstance(k, str) or not OPTION_KEY.fullmatch(k):
            raise SpecError(f"{where.source}: {key}: option {k!r}: expected a lower-case name (split_waves)")
        if isinstance(v, (dict, set)) or (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)):
            raise SpecError(f"{where.source}: {key}.{k}: expected a value or a list of values, found {v!r}")
    return tuple(sorted((k, _option_text(v)) for k, v in body.items()))


def _option_text(value: Any) -> str:
    """A YAML value as --option's text: booleans 1/0, lists comma-joined, None as none."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def _cells(where: _Where, data: Any, defaults: dict) -> tuple[Cell, ...]:
    if not isinstance(data, list) or not data:
        raise SpecError(f"{where.source}: cells: expected a non-empty list, found {data!r}")
    cells = []
    for i, body in enumerate(data):
        key = f"cells[{i}]"
        body = where.mapping(body, key, {"batch", "prompt_len", "gen_len", "checkpoint"})
        own = where.mapping(body.get("checkpoint", {}), f"{key}.checkpoint", _checkpoint_keys())
        cells.append(Cell(batch=where.count(body.get("batch"), f"{key}.batch", 1, LIMITS["batch"]),
                          prompt_len=where.count(body.get("prompt_len"), f"{key}.prompt_len", 1,
                                                 LIMITS["prompt_len"]),
                          gen_len=where.count(body.get("gen_len"), f"{key}.gen_len", 1, LIMITS["gen_len"]),
                          checkpoint=_checkpoint(where, {**defaults, **own}, f"{key}.checkpoint")))
    return tuple(cells)


def _checkpoint(where: _Where, body: dict, key: str) -> Checkpoint:
    layers = body.get("layers")
    return Checkpoint(
        preset=where.text(body.get("preset", "tiny"), f"{key}.preset"),
        naming=where.text(body.get("naming", "modelopt"), f"{key}.naming"),
        head=where.text(body.get("head", "nvfp4"), f"{key}.head"),
        seed=where.count(body.get("seed", 0), f"{key}.seed", 0),
        layers=None if layers is None else where.count(layers, f"{key}.layers", 1, LIMITS["layers"]),
        quant_config=where.text(body.get("quant_config", "legacy"), f"{key}.quant_config"),
        prefix=where.text(body.get("prefix", "model."), f"{key}.prefix"))


def _attribute(where: _Where, data: Any) -> Attribute:
    body = where.mapping(data, "attribute", {"lengths", "iters"})
    lengths = body.get("lengths")
    if (not isinstance(lengths, list) or len(lengths) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) for n in lengths)
            or lengths[0] < 2 or lengths[1] <= lengths[0]):
        raise where.fail("attribute.lengths", "two increasing integers >= 2 ([short, long] generation lengths)",
                         lengths)
    if lengths[1] > LIMITS["gen_len"]:
        raise where.fail("attribute.lengths", f"generation lengths <= {LIMITS['gen_len']}", lengths)
    return Attribute(lengths=(lengths[0], lengths[1]),
                     iters=where.count(body.get("iters", 3), "attribute.iters", 1, LIMITS["iters"]))


def _policy(where: _Where, data: Any) -> Policy:
    body = where.mapping(data, "verdict", {"rule", "direction_rule", "alpha", "tolerance"})
    if "rule" in body and "direction_rule" in body:
        raise SpecError(f"{where.source}: verdict: give rule or direction_rule (the issue's name), not both")
    rule_key = "direction_rule" if "direction_rule" in body else "rule"
    alpha = where.number(body.get("alpha", 0.05), "verdict.alpha")
    tolerance = where.number(body.get("tolerance", 0.02), "verdict.tolerance")
    for key, value in (("alpha", alpha), ("tolerance", tolerance)):
        if not 0 < value < 1:
            raise SpecError(f"{where.source}: verdict.{key}: expected a number in (0, 1), found {value!r}")
    return Policy(rule=where.choice(body.get(rule_key, "rank"), f"verdict.{rule_key}", RULES),
                  alpha=alpha, tolerance=tolerance)


class _Where:
    """Typed field readers whose errors say `<file>: <key>: expected ..., found ...`."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, expected: str, found: Any) -> SpecError:
        return SpecError(f"{self.source}: {key or '<top level>'}: expected {expected}, found {found!r}")

    def mapping(self, data: Any, key: str, allowed: set[str] | None) -> dict:
        if not isinstance(data, dict):
            raise self.fail(key, "a mapping", data)
        unknown = sorted(str(k) for k in data if allowed is not None and k not in allowed)
        if unknown:
            where = f"{key}." if key else ""
            raise SpecError(f"{self.source}: {where}{unknown[0]}: unknown key "
                            f"(expected one of {', '.join(sorted(allowed))})")
        return data

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, "a non-empty string", value)
        return value

    def choice(self, value: Any, key: str, options: tuple[str, ...]) -> str:
        if value not in options:
            raise self.fail(key, f"one of {', '.join(options)}", value)
        return value

    def count(self, value: Any, key: str, minimum: int, maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"an integer >= {minimum}", value)
        if maximum is not None and value > maximum:
            raise self.fail(key, f"an integer <= {maximum} (the bound in grids/spec.py LIMITS)", value)
        return value

    def number(self, value: Any, key: str, maximum: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or not math.isfinite(value):
            raise self.fail(key, "a finite positive number", value)
        if maximum is not None and value > maximum:
            raise self.fail(key, f"a number <= {maximum:g} (the bound in grids/spec.py LIMITS)", value)
        return float(value)
