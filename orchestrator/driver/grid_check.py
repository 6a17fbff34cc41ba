"""The grid a gate asks for, checked on the driver before anything runs: the CLI's `gate --grid`
and the service's queue both call `check_grid`."""
from __future__ import annotations

from grids.spec import GridSpec, SpecError, parse_spec_text, repo_relative
from orchestrator.driver.provenance import Archive
from orchestrator.tarball import read_member


class RequestError(ValueError):
    """A gate request refused before anything runs (a grid spec the head does not have or that does not parse)."""


def check_grid(arch: Archive, grid: str) -> str:
    """The grid spec as the box will name it (relative to the repository root), after checking the head
    has it and it parses (types, bounds: grids.spec); RequestError otherwise, before anything runs.
    The API's queueing and the CLI's `gate --grid` both call it."""
    try:
        grid = repo_relative(grid, arch.repo)
        read_grid(arch, grid)
    except SpecError as e:
        raise RequestError(str(e)) from None  # names the spec, the head and the key
    return grid


def read_grid(arch: Archive, grid: str) -> GridSpec:
    """The spec `check_grid` accepted, parsed from the archive (`orchestrator compare` reads its arms)."""
    # The same places the box looks (`box/grid.spec_path`), read from the archive without unpacking.
    candidates = (grid, f"grids/{grid}", f"grids/{grid}.yaml")
    for c in candidates:
        text = read_member(arch.tarball, c)
        if text is not None:
            return parse_spec_text(text, f"{c} at {arch.sha[:12]}")
    raise RequestError(f"grid spec {grid!r}: not in {arch.sha[:12]} (looked for {', '.join(candidates)})")
