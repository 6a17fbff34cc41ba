"""The import graph of regate's packages, read from the source with `ast` (nothing is imported):
no module imports itself back through another, and no product package imports the tools beside it
(tools/: the kernels' benchmark and offline sweeps, the decode attribution). Imports inside functions count too: a
lazy import is a dependency that only waits to bite."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "engine", "kernels", "gates", "grids", "nvfp4", "tools")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The regate modules `path` imports: `from a import b` is a.b when that is a module, else a."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, name, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_reads_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from kernels import tile_gemm\n    import kernels.table\n")
    assert imports_of(f, "x", {"kernels", "kernels.tile_gemm", "kernels.table"}) == {"kernels.tile_gemm",
                                                                                   "kernels.table"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    found = [c for c in cycles(graph()) if any(m.split(".")[0] == package for m in c)]
    assert not found, f"import cycles through {package}/: {found}"


def test_the_tools_hold_the_tuning_attribution_synthesis_and_ablation_code():
    modules = graph()
    assert any(m.startswith("tools.tune.") for m in modules), "tools/tune/ holds the tuning code"
    assert "tools.attribution.measure" in modules and not any(m.startswith("engine.attribution") for m in modules)
    assert "tools.synth.cache" in modules and not any(m in ("engine.synth", "engine.ckpt_cache") for m in modules)
    assert "tools.ablation.parts" in modules and "engine.ablate" not in modules
    # the engine's one hook for it is the Engine's `substitute`: no kernel or engine call takes an ablation
    def params(names: tuple[str, ...]) -> list[str]:
        return [f"{path.relative_to(ROOT)}:{fn.name}" for pkg in ("engine", "kernels") for path in (ROOT / pkg).rglob("*.py")
                for fn in ast.walk(ast.parse(path.read_text())) if isinstance(fn, ast.FunctionDef)
                and any(a.arg in names for a in fn.args.args + fn.args.kwonlyargs)]
    assert "kernels/tile_gemm.py:tile_gemm" in params(("policy",))  # the scan sees the kernels' parameters
    assert params(("ablate", "ablation", "allow_ablation")) == []


# Package floors: what may import what. The box side (orchestrator/box/) never imports the driver side
# (orchestrator/driver/): the box runs the trusted harness alone, and the tarball helpers both need are
# the bottom module orchestrator/tarball.py. gates/ (the judges) never imports orchestrator/: a tool
# that runs suites through the box's runner (the census twin) lives in orchestrator/box/.
# (lower, upper): `lower` never imports `upper`. The judging side (orchestrator, grids: what the box
# imports from the trusted tree, orchestrator/driver/harness.py) imports no engine or kernel of any tree:
# the trusted bundle holds none, and the head's are the head's to run in its own processes.
FLOORS = [("orchestrator.box", "orchestrator.driver"), ("gates", "orchestrator"),
          ("orchestrator", "engine"), ("orchestrator", "kernels"), ("grids", "engine"), ("grids", "kernels"),
          # the NVFP4 format (nvfp4/) is the floor engine and kernels stand on; kernels never reach up into engine
          ("nvfp4", "engine"), ("nvfp4", "kernels"), ("kernels", "engine"),
          # tools (tools/: tuning, attribution, synthesis, ablation) stand beside the engine core: they import it, nothing
          # of the product imports them, but for the suites' checkpoints (gates -> tools.synth: a judge's fixtures)
          *[(p, "tools") for p in ("engine", "kernels", "nvfp4", "grids", "orchestrator")],
          ("gates", "tools.tune"), ("gates", "tools.attribution"), ("gates", "tools.ablation")]


def crossings(g: dict[str, set[str]], lower: str, upper: str) -> dict[str, list[str]]:
    under = lambda m, p: m == p or m.startswith(p + ".")  # noqa: E731
    return {m: sorted(d for d in deps if under(d, upper)) for m, deps in g.items()
            if under(m, lower) and any(under(d, upper) for d in deps)}


def test_the_floor_checker_sees_a_crossing():
    g = {"orchestrator.box.job": {"orchestrator.driver.provenance", "orchestrator.tarball"},
         "orchestrator.boxes": {"orchestrator.driver"}, "gates.x": {"grids.spec"}}
    assert crossings(g, "orchestrator.box", "orchestrator.driver") == {"orchestrator.box.job": ["orchestrator.driver.provenance"]}
    assert crossings(g, "gates", "orchestrator") == {}


@pytest.mark.parametrize("lower,upper", FLOORS, ids=[f"{a}-not-{b}" for a, b in FLOORS])
def test_a_package_never_imports_above_its_floor(lower, upper):
    found = crossings(graph(), lower, upper)
    assert not found, f"{lower} imports {upper}: {found}"
