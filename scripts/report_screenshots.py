"""Screenshots of gate reports for docs/ (headless Chromium): a report HTML file, or the GPU fixture.

    python scripts/report_screenshots.py shot REPORT.html OUT.png [--height 1500]
    python scripts/report_screenshots.py gpu-fixture OUT_DIR      # renders docs' GPU example, then shoots it

The GPU example is RENDERED FROM A FIXTURE (`gpu_fixture_record` below: a record shaped as an H200
gate writes it, every suite GREEN), not from a run: it shows what a full pass looks like beside the
CPU box's partial one. Its numbers are illustrative and claim nothing about any engine.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND")
SHA = "0" * 40  # the fixture's head: no real commit


def shot(html: Path, out: Path, width: int = 1280, height: int = 1500) -> Path:
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("report_screenshots: chromium is not installed (apt-get install -y chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="regate-shot-") as profile:
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={out.resolve()}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    return out


def _suite(name: str, sacred: bool, needs: list[str], tests: int, checks: int, secs: float) -> dict:
    return {"name": name, "sacred": sacred, "needs": needs, "state": "GREEN", "tests_passed": tests,
            "tests_total": tests, "checks_passed": checks, "checks_total": checks, "census_tests": tests,
            "census_checks": checks, "duration_s": secs, "failures": [], "reasons": [], "sacred_modified": False}


def _cell(batch: int, packed: list[float], dequant: list[float]) -> dict:
    from grids.verdict import judge

    legs = {"packed": packed, "dequant": dequant}
    return {"cell": {"label": f"b{batch} p128 g64 27b/4L modelopt", "batch": batch, "prompt_len": 128,
                     "gen_len": 64, "checkpoint": {"preset": "27b", "layers": 4, "naming": "modelopt"}},
            "arms": {a: {"options": {"lm_head": a, "backend": "cuda", "extra_args": []}, "legs": xs,
                         "raw": [{"decode_tok_s": x} for x in xs]} for a, xs in legs.items()},
            "verdict": judge(legs)}


def gpu_fixture_record() -> dict:
    """An H200 gate as the job records it (shape only; illustrative numbers): every suite GREEN, the
    packed-GEMM marker required and present, one binding cell and one owed cell."""
    n, k = 248320, 5120
    head = {"name": "lm_head", "class": "head", "format": "nvfp4", "n": n, "k": k,
            "packed_bytes": n * k // 2 + n * k // 16 + 4, "dequant_bytes": 0, "kernel_operand_bytes": 0}
    return {
        "schema_version": 1, "run_id": "FIXTURE-gpu-example", "kind": "gate", "state": "PASSED",
        "head": {"rev": "fixture", "sha": SHA, "repo": "(fixture)"},
        "created_at": "2026-12-03T12:00:00Z", "finished_at": "2026-12-03T12:09:30Z",
        "box": {"name": "h200-a (fixture)", "node_id": "fixture", "gpu": "NVIDIA H200", "backend": "cuda"},
        "provenance": {"md5_head": "f" * 32, "md5_box": "f" * 32, "archive_bytes": 1_234_567},
        "lock": {"path": "~/gpu.lock", "wait_s": 0.0}, "idle": {"checked": True, "idle": True, "detail": "0% util"},
        "build": {"markers": ["packed NVFP4 W4A16 GEMM: ENABLED for sm_90"],
                  "required": ["packed NVFP4 W4A16 GEMM: ENABLED"], "missing": [], "duration_s": 95.0},
        "versions": {"python": "3.11", "torch": "(fixture)", "triton": "(fixture)", "ray": "(fixture)"},
        "suites": [_suite("paged_engine", True, ["cpu"], 13, 950, 40.0),
                   _suite("dense_lmhead_fp4", False, ["cpu"], 10, 364, 30.0),
                   _suite("paged_forward", False, ["cpu"], 6, 250, 25.0),
                   _suite("packed_gemm", False, ["cuda"], 10, 60, 20.0)],
        "mutations": [], "sacred": {"ok": True, "accepted": False, "modified": [], "message": "sacred suites unmodified"},
        "gate_set": {"ok": True, "accepted": False, "changes": [],
                     "message": "the head runs every trusted suite at its trusted census"},
        "grid": {"schema_version": 1, "spec": "lmhead", "complete": True,
                 "policy": {"rule": "rank", "alpha": 0.05, "tolerance": 0.02},
                 "cells": [_cell(1, [30.1, 30.2, 30.15], [22.0, 22.05, 22.1]),
                           _cell(16, [180.0, 184.0, 179.5], [170.0, 176.0, 168.0])]},
        "residency": [{"weights": [head], "totals": {}, "backend": "cuda", "arm": "packed"}],
        "not_run": [{"what": "mutation pins", "why": "mutations: off in the trusted gates.yaml, so no pin was "
                     "applied in this gate; `orchestrator mutate --head <sha> --all` runs them"}],
        "error": None, "timings": {"total_s": 570.0}, "report_path": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shot")
    s.add_argument("html", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--height", type=int, default=1500)
    g = sub.add_parser("gpu-fixture")
    g.add_argument("out_dir", type=Path)
    g.add_argument("--height", type=int, default=1500)
    args = ap.parse_args()
    if args.cmd == "shot":
        print(shot(args.html, args.out, height=args.height))
        return
    from orchestrator.record import Record
    from orchestrator.report.render import render_run

    html = render_run(Record.from_json(gpu_fixture_record()), args.out_dir)  # a v1 record, migrated
    print(html)
    print(shot(html, args.out_dir / "report-gpu-fixture.png", height=args.height))


if __name__ == "__main__":
    main()
