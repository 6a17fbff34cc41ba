"""Run records for the report and owed-ledger tests, in the DESIGN.md "Run record" shape."""
from __future__ import annotations

import copy

SEED_LEGS = {"packed": [11.197, 11.193], "dequant": [9.418, 10.163]}
SEED_CELL = {"batch": 1, "prompt_len": 128, "gen_len": 32, "preset": "27b"}
HEAD_N, HEAD_K = 248320, 5120  # the 27B lm_head


def seed_verdict() -> dict:
    """The seed's example judged by hand in the grids.verdict.judge shape (rank rule, 2 legs per arm)."""
    return {
        "direction": {"state": "indicated", "winner": "packed", "p": 1 / 6, "legs_needed": 3},
        "magnitude": {"state": "owed", "ratio": 11.195 / 9.7905, "ci": [1.1013, 1.1889],
                      "reasons": ["dequant legs disagree by 7.9% > 2%",
                                  "ratio 1.143 has 95% interval [1.101, 1.189], wider than +-2% ([1.121, 1.166])"],
                      "legs_needed": None},
        "arms": {"packed": {"legs": SEED_LEGS["packed"], "median": 11.195, "spread": 0.004 / 11.193},
                 "dequant": {"legs": SEED_LEGS["dequant"], "median": 9.7905, "spread": 0.745 / 9.418}},
        "policy": {"rule": "rank", "alpha": 0.05, "tolerance": 0.02},
    }


def binding_verdict() -> dict:
    legs = {"packed": [11.197, 11.193, 11.195], "dequant": [9.80, 9.79, 9.81]}
    return {
        "direction": {"state": "established", "winner": "packed", "p": 0.05, "legs_needed": 0},
        "magnitude": {"state": "binding", "ratio": 11.195 / 9.80, "ci": [1.1413, 1.1440], "reasons": [],
                      "legs_needed": 0},
        "arms": {k: {"legs": v, "median": sorted(v)[1], "spread": (max(v) - min(v)) / min(v)} for k, v in legs.items()},
    }


def _weights() -> list[dict]:
    head_packed = HEAD_N * HEAD_K // 2 + HEAD_N * HEAD_K // 16 + 4
    tower = [{"name": f"layers.{i}.mlp.down_proj", "class": "tower", "n": 5120, "k": 17408,
              "packed_bytes": 5120 * 17408 * 9 // 16 + 4, "dequant_bytes": 0, "kernel_operand_bytes": 0}
             for i in range(2)]
    return [{"name": "lm_head", "class": "head", "n": HEAD_N, "k": HEAD_K, "packed_bytes": head_packed,
             "dequant_bytes": 2 * HEAD_N * HEAD_K, "kernel_operand_bytes": 0}] + tower


BASE = {
    "schema_version": 1, "run_id": "r-0001", "kind": "gate", "state": "PASSED",
    "head": {"rev": "HEAD", "sha": "fa6ef3fe0123456789abcdef0123456789abcdef", "repo": "/src/engine"},
    "created_at": "2026-11-30T07:00:00Z", "finished_at": "2026-11-30T07:04:10Z",
    "box": {"name": "spark", "node_id": "a1b2c3d4e5f6a7b8", "gpu": None, "backend": "cpu"},
    "provenance": {"md5_head": "8ed322ffa6baa4c44f52a48362ede4fc", "md5_box": "8ed322ffa6baa4c44f52a48362ede4fc",
                   "archive_bytes": 123456},
    "lock": {"path": "/root/gpu.lock", "wait_s": 0.4}, "idle": {"checked": False, "idle": None, "detail": "no GPU"},
    "build": {"markers": ["packed NVFP4 W4A16 GEMM: DISABLED (no CUDA)"], "required": [], "missing": [],
              "duration_s": 3.2},
    "versions": {"python": "3.11.2", "torch": "2.13.0", "triton": None, "ray": "2.60.0"},
    "suites": [
        {"name": "paged_engine", "sacred": True, "needs": [], "state": "GREEN", "tests_passed": 235,
         "tests_total": 235, "checks_passed": 1314, "checks_total": 1314, "census_tests": 235,
         "census_checks": 1314, "duration_s": 48.5, "failures": [], "sacred_modified": False},
        {"name": "lmhead_fp4", "sacred": False, "needs": [], "state": "GREEN", "tests_passed": 7, "tests_total": 7,
         "checks_passed": 1314, "checks_total": 1314, "census_tests": 7, "census_checks": 1170,
         "duration_s": 1.6, "failures": [], "sacred_modified": False},
    ],
    "mutations": [{"pin": "keep_dequant_b-second-setter", "suite": "lmhead_fp4", "state": "KILLED",
                   "failures": 11, "expected_min": 1}],
    "grid": None, "residency": None, "not_run": [], "error": None,
    "timings": {"archive_s": 0.2, "transfer_s": 0.1, "build_s": 3.2, "lock_wait_s": 0.4, "gates_s": 50.1,
                "grid_s": 0.0, "total_s": 54.3},
    "report_path": None,
}


def record(**over) -> dict:
    r = copy.deepcopy(BASE)
    r.update(copy.deepcopy(over))
    return r


def grid(verdict: dict, cell: dict = SEED_CELL, tolerance: float = 0.02) -> dict:
    legs = {arm: a["legs"] for arm, a in verdict["arms"].items()}
    return {"schema_version": 1, "spec": "lmhead", "policy": {"tolerance": tolerance},
            "cells": [{"cell": dict(cell), "verdict": verdict,
                       "arms": {arm: {"legs": xs, "raw": [{"decode_tok_s": x} for x in xs]}
                                for arm, xs in legs.items()}}]}


def seed_record(**over) -> dict:
    """A CPU-box run with the seed's throughput legs and the 27B head's residency (dequant arm)."""
    base = dict(run_id="r-seed", grid=grid(seed_verdict()),
                residency={"weights": _weights(), "totals": {}, "backend": "cpu", "arm": "dequant"})
    return record(**{**base, **over})


def error_record() -> dict:
    """A run that died at provenance: most fields never got filled."""
    return {"schema_version": 1, "run_id": "r-err", "kind": "gate", "state": "ERROR",
            "head": {"rev": "HEAD", "sha": "0badc0de" * 5, "repo": "/src/engine"},
            "created_at": 1796000000.0, "finished_at": None, "box": {"name": "spark"},
            "provenance": {"md5_head": "aa" * 16, "md5_box": "bb" * 16, "archive_bytes": 99},
            "suites": [], "mutations": [], "grid": None, "residency": None, "not_run": [],
            "error": "md5 mismatch: head aaaa… box bbbb…; refusing the archive"}
