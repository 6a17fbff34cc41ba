"""The trusted harness: which tree judges a head, its bundle and digest, how the box unpacks and starts
it, the spec it reads, the isolated Python it runs, and the marker probe's own verdict."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orch_helpers import commit_all, git, trusted_clone
from orchestrator.box.compare import CompareSpec
from orchestrator.box.job import JobSpec
from orchestrator.box.main import spec_from_json
from orchestrator.box.marker_proof import prove
from orchestrator.box.tree import Tree
from orchestrator.config import BoxConfig, IdlePolicy
from orchestrator.driver.harness import (ENTRY, HarnessError, default_ref, files_of, from_directory, from_ref,
                                         trusted_harness)
from orchestrator.driver.launch import harness_dir
from orchestrator.driver.placement import spec_json
from orchestrator.pyboot import isolated_python


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """This checkout as committed work, no remote: its `main` judges every head below."""
    return trusted_clone(tmp_path_factory.mktemp("trusted") / "repo")


def test_a_ref_and_its_checkout_bundle_to_the_same_digest(repo):
    by_ref = from_ref(repo, "main", "--trusted-ref")
    by_dir = from_directory(repo)
    assert by_ref.digest == by_dir.digest and by_ref.sha == git(repo, "rev-parse", "main").strip()
    files = files_of(by_ref.tarball)
    assert ENTRY in files and "gates/gates.yaml" in files and "gates/census.py" in files
    assert not any(p.startswith(("engine/", "kernels/", "tests/")) for p in files), "the head's code is not a judge"


def test_the_default_is_origin_head_else_the_merge_base_with_main(repo, tmp_path):
    head = tmp_path / "head"
    subprocess.run(["git", "clone", "-q", str(repo), str(head)], check=True)
    main_sha = git(head, "rev-parse", "HEAD").strip()
    git(head, "checkout", "-q", "-b", "feature")
    (head / "NOTE").write_text("x")
    sha = commit_all(head, "a head")
    assert default_ref(head, sha) == ("origin/main", "origin/HEAD")
    git(head, "remote", "remove", "origin")
    assert default_ref(head, sha) == (main_sha, "merge-base")
    h = trusted_harness(head, sha)
    assert h.sha == main_sha and h.source == "merge-base"
    git(head, "branch", "-D", "main")
    with pytest.raises(HarnessError, match="no trusted ref"):
        default_ref(head, sha)


def test_a_trusted_tree_older_than_the_harness_is_refused(tmp_path):
    old = tmp_path / "old"
    (old / "gates").mkdir(parents=True)
    (old / "gates/gates.yaml").write_text("suites: []\n")
    git(old.parent, "init", "-q", str(old))
    sha = commit_all(old, "before the harness")
    with pytest.raises(HarnessError, match="predates the trusted harness"):
        from_ref(old, sha, "--trusted-ref")
    with pytest.raises(HarnessError, match="unknown trusted ref"):
        from_ref(old, "nope", "--trusted-ref")


def test_the_box_unpacks_the_bundle_once_and_checks_it_at_every_use(repo, tmp_path):
    h = from_ref(repo, "main", "--trusted-ref")
    root = harness_dir(h.tarball, h.digest, str(tmp_path))
    assert (root / ENTRY).is_file() and harness_dir(h.tarball, h.digest, str(tmp_path)) == root
    (root / "gates/census.py").write_text("# tampered on the box\n")
    assert harness_dir(h.tarball, h.digest, str(tmp_path)) == root  # replaced, not trusted as it was
    assert (root / "gates/census.py").read_bytes() == files_of(h.tarball)["gates/census.py"]
    with pytest.raises(HarnessError, match="does not match the driver's digest"):
        harness_dir(h.tarball, "sha256:" + "0" * 64, str(tmp_path))


def test_a_spec_travels_as_json_and_tolerates_a_newer_driver():
    box = BoxConfig("b", "~/gpu.lock", 1, ("m",), IdlePolicy(5.0, "abort"), "none")
    spec = JobSpec("run", "sha", "md5", box, 1.0, 2.0, 3.0, None, "grids/smoke.yaml", ("h",), None, True, False,
                   ("/state",))
    data = json.loads(json.dumps(spec_json(spec)))
    assert spec_from_json(data) == spec
    assert spec_from_json({**data, "a_field_of_a_newer_driver": 1}) == spec
    comp = CompareSpec("run", "b", "h", "m1", "m2", box, 1.0, 2.0, 3.0, "grids/smoke.yaml", hidden=("/s",))
    back = spec_from_json(json.loads(json.dumps(spec_json(comp))))
    assert back == comp and dataclasses.asdict(back) == dataclasses.asdict(comp)


def test_isolated_python_puts_the_standard_library_first_and_loads_no_site(tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('the tree shadowed the standard library')\n")
    (tmp_path / "sitecustomize.py").write_text("open('SITE', 'w')\n")
    (tmp_path / "pytest.py").write_text("raise SystemExit('the tree replaced pytest')\n")
    code = "import json, sys, pytest; print(json.dumps([pytest.__file__, 'site' in sys.modules]))"
    r = subprocess.run(isolated_python(sys.executable, [str(tmp_path)], "-c", code, preload=("pytest",)),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pytest_file, site_loaded = json.loads(r.stdout)
    assert not pytest_file.startswith(str(tmp_path)) and not site_loaded and not (tmp_path / "SITE").exists()


def test_the_probe_does_not_take_a_verdict_the_head_printed(tmp_path):
    # The head's tree comes before the installed libraries: its own `torch` prints forged verdicts and exits.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch/__init__.py").write_text(
        "import json, os\nprint(json.dumps({'proven': True}))\nprint(json.dumps({'nonce': 'guess', 'proven': True}))\n"
        "os._exit(0)\n")
    verdict = prove(Tree(tmp_path / "torch", scratch=tmp_path).at(tmp_path), timeout_s=120)
    assert verdict["proven"] is False and "printed no verdict of its own" in verdict["why"]


def test_the_probe_says_why_without_a_gpu(tmp_path):
    verdict = prove(Tree(tmp_path, scratch=tmp_path), timeout_s=120)
    assert verdict == {"proven": False, "why": "no CUDA GPU on this box"}
