"""No product module reads an engine or kernel switch from the environment (issue 51): every
behaviour switch is an EngineOptions field (engine/options.py), passed down explicitly. Only the
infrastructure variables below (directories, threads, the census channel, a run's token) stay in the
environment. Read from the source with `ast`: any string constant that is exactly a REGATE_* name
(an os.environ / getenv / environ.get / environ[...] key, or a module constant naming one) outside
the allow-list fails, wherever it is read from."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "kernels", "grids", "gates", "nvfp4", "tools")
NAME = re.compile(r"REGATE_[A-Z0-9_]*")
INFRASTRUCTURE = {
    "REGATE_CACHE",  # tools/synth/cache.py: where synthesized checkpoints are cached
    "REGATE_SYNTH_DEVICE", "REGATE_SYNTH_THREADS",  # tools/synth/checkpoint.py: where and how wide synthesis runs
    "REGATE_CENSUS_OUT", "REGATE_CENSUS_FD", "REGATE_CENSUS_NONCE", "REGATE_CENSUS_TWIN",  # gates/: the census
    "REGATE_RUN",  # a run's token (orchestrator/box)
}
# (file, name): the bench records the infrastructure variables set (meta.switches) by their prefix.
RECORDED = {("engine/commands/bench.py", "REGATE_")}


def env_names(source: str, path: str) -> list[tuple[int, str]]:
    """(line, name) of each string constant in `source` that names a REGATE_* variable (or is the bare
    prefix) and is not allowed."""
    out = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            if node.value not in INFRASTRUCTURE and (path, node.value) not in RECORDED:
                out.append((node.lineno, node.value))
    return out


def test_no_product_module_reads_a_switch_from_the_environment():
    found = []
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            found += [f"{rel}:{line}: {name}" for line, name in env_names(p.read_text(), rel)]
    assert not found, ("engine/kernel switches read from the environment; make them EngineOptions fields "
                       "(engine/options.py):\n" + "\n".join(found))


def test_the_scan_catches_each_kind_of_read():
    """Planted reads: each form is caught; a message or docstring naming a variable is not a read."""
    planted = '''
import os
ENV = "REGATE_PDL"
a = os.environ.get("REGATE_SPLIT_WAVES", "2")
b = os.getenv("REGATE_TILE_GEMM")
c = os.environ["REGATE_DELTA_TARGET"]
d = {k: v for k, v in os.environ.items() if k.startswith("REGATE_")}
e = os.environ.get("REGATE_CACHE")
def f():
    """REGATE_PDL=0 used to switch this."""
    raise ValueError(f"REGATE_PDL: expected 0 or 1, found {a!r}")
'''
    assert [name for _, name in env_names(planted, "engine/planted.py")] == [
        "REGATE_PDL", "REGATE_SPLIT_WAVES", "REGATE_TILE_GEMM", "REGATE_DELTA_TARGET", "REGATE_"]
    assert env_names('d = [k for k in x if k.startswith("REGATE_")]', "engine/commands/bench.py") == []
