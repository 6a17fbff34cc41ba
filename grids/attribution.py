"""The attribution step of a grid: `python -m tools.attribution --json` for each arm of a cell, once, after the
cell's legs, each arm in a fresh process like a bench leg (the spec's `attribute` key).

An attribution that fails is kept as that arm's error, never raised: the legs already measured stay
the grid's result, and the report says which attribution is missing and why.
"""
from __future__ import annotations

from grids.jsonline import last_json_object

SCHEMA_VERSION = 1
TAIL = 2000


def attribute_args(spec, cell, arm, model_dir: str) -> list[str]:
    short, long = spec.attribute.lengths
    return ["--model", model_dir, "--backend", arm.backend, "--lm-head", arm.lm_head, "--lengths", f"{short},{long}",
            "--batch", str(cell.batch), "--prompt-len", str(cell.prompt_len), "--iters", str(spec.attribute.iters),
            *arm.option_args(), *arm.extra_args, "--json"]


def attribute_cell(spec, attribute, index: int, model_dir: str) -> dict:
    """{"lengths", "iters", "arms": {arm: attribute JSON}, "errors": {arm: why}} of one cell;
    `attribute` is a grids.runner.Run: one `python -m tools.attribution` process per call."""
    cell = spec.cells[index]
    out = {"lengths": list(spec.attribute.lengths), "iters": spec.attribute.iters, "arms": {}, "errors": {}}
    for arm in spec.arms:
        where = f"grid {spec.name}: cell {index} ({cell.label}), arm {arm.name}, attribution"
        try:
            out["arms"][arm.name] = run_attribute(attribute, attribute_args(spec, cell, arm, model_dir),
                                                  spec.timeout_s, where)
        except AttributeRunError as e:
            out["errors"][arm.name] = str(e)
    return out


class AttributeRunError(RuntimeError):
    """An `python -m tools.attribution` process that failed or printed no usable JSON; names cell and arm."""


def run_attribute(attribute, args: list[str], timeout_s: float, where: str) -> dict:
    try:
        output = attribute(args, timeout_s)
    except Exception as e:  # the process edge: kept as this arm's error, in its own words
        raise AttributeRunError(f"{where}: {e}") from None
    return parse_attribute(output, where)


def parse_attribute(stdout: str, where: str) -> dict:
    """The last JSON line of `python -m tools.attribution --json`, checked against its contract."""
    record = last_json_object(stdout)
    if not isinstance(record, dict):
        raise AttributeRunError(f"{where}: printed no JSON line; stdout tail:\n{stdout[-TAIL:] or '(empty)'}")
    if record.get("schema_version") != SCHEMA_VERSION or record.get("kind") != "attribution":
        raise AttributeRunError(f"{where}: JSON: expected kind 'attribution' schema_version {SCHEMA_VERSION}, found "
                                f"kind {record.get('kind')!r} schema_version {record.get('schema_version')!r}")
    parts = record.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, dict) and "name" in p and "ms_per_step" in p
                                              for p in parts):
        raise AttributeRunError(f"{where}: JSON parts: expected a list of {{name, ms_per_step, ...}}, "
                                f"found {str(parts)[:80]}")
    for key in ("total_ms_per_step", "closure"):
        if key not in record:
            raise AttributeRunError(f"{where}: JSON {key}: missing")
    return record
