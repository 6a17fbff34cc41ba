"""The census of every CUDA suite, counted without a GPU: each `needs: [cuda]` suite run as its
census twin (gates.suites.twin: the same test code on the CPU at toy sizes) must execute exactly the
tests and checks gates.yaml records, so a change that moves a CUDA suite's census fails here, on a
machine with no GPU, instead of turning the gate red on the first GPU box."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from gates.manifest import load_manifest
from orchestrator.box.twin_census import cuda_suites, twin_counts

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", ".regate")
CUDA = [s.name for s in cuda_suites(ROOT)]


def test_every_cuda_suite_has_a_twin():
    assert set(CUDA) == {"packed_gemm", "cuda_engine"}


@pytest.mark.parametrize("name", CUDA)
def test_twin_counts_equal_the_census(name):
    suite = load_manifest(ROOT).suite(name)
    assert twin_counts(ROOT, suite, sys.executable) == (suite.census_tests, suite.census_checks), (
        f"{name}: the suite's census moved; run `python -m orchestrator.box.twin_census` and update gates/gates.yaml")


def test_a_one_line_added_check_is_seen_without_a_gpu(tmp_path):
    """The issue's case: one more check in a CUDA suite, gates.yaml untouched -> the counts differ."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=IGNORE)
    path = tree / "gates/suites/test_packed_gemm.py"
    line = '    check(fp4_gemm_for(BACKEND) is not None, f"the {BACKEND} backend has no fp4 GEMM registered")\n'
    text = path.read_text()
    assert line in text
    path.write_text(text.replace(line, line + '    check(True, "one more")\n'))
    suite = load_manifest(tree).suite("packed_gemm")
    assert twin_counts(tree, suite, sys.executable) == (suite.census_tests, suite.census_checks + 1)
