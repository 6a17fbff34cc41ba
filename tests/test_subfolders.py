"""Run from any folder of the repository: the whole repository is archived (not the folder), its md5 is
of that archive, and a `--grid` path typed relative to the folder names the spec in the repository."""
from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from orch_helpers import FAKE_GRID, make_stub_repo, suite  # noqa: E402

from orchestrator.driver.grid_check import check_grid  # noqa: E402
from orchestrator.driver.provenance import archive, cwd_path  # noqa: E402
from orchestrator.tarball import md5_of  # noqa: E402


def _repo(tmp_path: Path) -> Path:
    return make_stub_repo(tmp_path / "repo", [suite("ok", "tests/test_ok.py", 1, 1)],
                          {"tests/test_ok.py": "def test_ok(check):\n    check(True, 'ok')\n",
                           "grids/fake.yaml": FAKE_GRID, "docs/lab/note.md": "a note\n"})


def test_an_archive_made_from_a_subfolder_is_the_whole_repository(tmp_path):
    repo = _repo(tmp_path)
    whole, sub = archive(repo, "HEAD"), archive(repo / "docs" / "lab", "HEAD")
    assert sub.tarball == whole.tarball and sub.md5 == whole.md5 == md5_of(sub.tarball)
    assert sub.repo == whole.repo == str(repo.resolve())
    names = tarfile.open(fileobj=io.BytesIO(sub.tarball)).getnames()
    assert "gates/gates.yaml" in names and "engine/cli.py" in names


def test_a_grid_path_from_a_subfolder_names_the_spec_in_the_repository(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.chdir(repo / "docs" / "lab")
    arch = archive(".", "HEAD")
    assert check_grid(arch, cwd_path("../../grids/fake.yaml")) == "grids/fake.yaml"  # from this folder
    assert check_grid(arch, cwd_path("grids/fake.yaml")) == "grids/fake.yaml"  # from the root, as before
    assert check_grid(arch, cwd_path("fake")) == "fake"  # a bare name: the box looks in grids/
    monkeypatch.chdir(repo)
    assert cwd_path("grids/fake.yaml") == str((repo / "grids" / "fake.yaml").resolve())
    assert check_grid(archive(".", "HEAD"), cwd_path("grids/fake.yaml")) == "grids/fake.yaml"
