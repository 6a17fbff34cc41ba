"""`orchestrator mutate --head REV [--repo PATH] [--pin NAME | --all] [--json]`: prove the gates can fail.

The revision is `git archive`d into a fresh temp tree (the user's working tree is never touched);
each pin of that tree is applied in its own copy and its suite run there (`gates.mutate`). Each pin
reads KILLED (red as pinned), SURVIVED, STALE (no longer applies) or NOT_RUN (its suite needs a CUDA
GPU and this machine has none). Exit 0 when every pin that could run here was KILLED (NOT_RUN pins are
counted on the summary line, never as killed: run them on a GPU box); 1 when any SURVIVED or is STALE
(a stale pin proves nothing about the gate it pinned: the mutation it guards is unguarded until the
pin is rewritten); 2 on usage or provenance errors.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from gates.manifest import ManifestError
from orchestrator.box.mutate import STALE, SURVIVED, run_pins
from orchestrator.box.tree import Tree
from gates.pins import PinError
from orchestrator.driver.provenance import ProvenanceError, archive
from orchestrator.tarball import unpack
from orchestrator.errors import fail


def mutate(head: str, repo: str | Path = ".", pins: list[str] | None = None,
           python: str = sys.executable, progress=None) -> dict:
    """Archive `head` of `repo` into a temp tree and run the pins there; returns
    {head: {rev, sha, repo}, mutations: [run_pins dicts]}."""
    arc = archive(repo, head)
    work = Path(tempfile.mkdtemp(prefix="regate-head-"))
    tree = Tree(work / "tree", python=python, scratch=work)
    try:
        tree.start_keeper()  # a killed `orchestrator mutate` leaves no suite running and no tree behind
        unpack(arc.tarball, tree.root)
        results = run_pins(tree, pins, progress=progress)
    finally:
        tree.reap()
        tree.stop_keeper()
        shutil.rmtree(work, ignore_errors=True)
    return {"head": {"rev": head, "sha": arc.sha, "repo": arc.repo}, "mutations": results}


def exit_code(results: list[dict]) -> int:
    return 1 if any(r["state"] in (SURVIVED, STALE) for r in results) else 0


def _line(r: dict) -> str:
    return f"{r['state']:<9} {r['pin']}  [{r['suite']}]  {r['detail']}"


def register(app: typer.Typer) -> None:
    @app.command("mutate")
    def mutate_cmd(
        head: str = typer.Option(..., "--head", metavar="REV",
                                 help="revision to mutate (archived; your tree is untouched)"),
        repo: Path = typer.Option(Path("."), "--repo", metavar="DIR", help="git repository holding the revision"),
        pin: Optional[list[str]] = typer.Option(None, "--pin", help="pin name (repeatable)"),
        all_pins: bool = typer.Option(False, "--all", help="run every pin"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON line"),
    ) -> None:
        """Apply mutation pins to a head in fresh trees; each must turn its suite RED."""
        if bool(pin) == all_pins:
            fail("give --pin NAME (repeatable) or --all, not both")
        progress = None if as_json else (lambda r: typer.echo(_line(r)))
        try:
            out = mutate(head, repo, None if all_pins else list(pin), progress=progress)
        except (ProvenanceError, ManifestError, PinError) as e:
            fail(e)
        results = out["mutations"]
        if as_json:
            typer.echo(json.dumps(out, sort_keys=True))
        else:
            counts = {s: sum(r["state"] == s for r in results) for s in ("KILLED", "SURVIVED", "STALE", "NOT_RUN")}
            typer.echo(f"{out['head']['sha'][:12]}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        raise typer.Exit(exit_code(results))
