"""gates.sacred: a head that changes a sacred suite, its counter, or its manifest entry is flagged,
against the TRUSTED manifest (re-recording the digest in the head's own gates.yaml does not help)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gates.manifest import load_manifest, suite_digest
from gates.sacred import MESSAGE, check_sacred

ROOT = Path(__file__).resolve().parents[1]
SACRED = load_manifest(ROOT).suite("paged_engine")
SACRED_FILES = sorted({f for s in load_manifest(ROOT).sacred() for f in s.files})


@pytest.fixture
def head(tmp_path):
    """A head tree holding the manifest and every sacred suite's files as this checkout has them."""
    for rel in ("gates/gates.yaml", "pyproject.toml", *SACRED_FILES):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _edit_yaml(head: Path, edit) -> None:
    p = head / "gates" / "gates.yaml"
    raw = yaml.safe_load(p.read_text())
    edit(next(s for s in raw["suites"] if s["name"] == SACRED.name))
    p.write_text(yaml.safe_dump(raw))


def test_unmodified_head_passes(head):
    c = check_sacred(head, trusted=ROOT)
    assert c.ok and c.modified == () and c.message() == "sacred suites unmodified"


def test_removed_assertion_is_flagged_and_fails_unless_accepted(head):
    suite = head / "gates/suites/test_paged_engine.py"
    text = suite.read_text()
    weakened = text.replace('        check.equal(packed[i], dequant[i],', '        (packed[i], dequant[i],', 1)
    assert weakened != text
    suite.write_text(weakened)
    c = check_sacred(head, trusted=ROOT)
    assert not c.ok and c.modified == ("paged_engine",)
    assert c.message().startswith(f"{MESSAGE}: paged_engine: files differ")
    assert "gates/suites/test_paged_engine.py" in c.message()
    accepted = check_sacred(head, trusted=ROOT, accept=True)
    assert accepted.ok and accepted.modified == ("paged_engine",) and "accepted" in accepted.message()


def test_rerecorded_digest_in_the_head_does_not_help(head):
    (head / "gates/suites/support.py").write_text((head / "gates/suites/support.py").read_text()
                                                  .replace("LOGIT_TOL = 1e-3", "LOGIT_TOL = 1e3"))
    _edit_yaml(head, lambda s: s.update(digest=suite_digest(head, SACRED)))
    c = check_sacred(head, trusted=ROOT)
    assert not c.ok
    assert any("support.py" in r for r in c.findings[0].reasons)


def test_weakened_counter_is_flagged(head):
    p = head / "gates/census.py"
    p.write_text(p.read_text().replace("ok = bool(cond)", "ok = True"))
    assert check_sacred(head, trusted=ROOT).modified == ("paged_engine", "cuda_engine")  # both count with it


@pytest.mark.parametrize("edit, what", [
    (lambda s: s["census"].update(checks=1), "census_checks"),
    (lambda s: s.update(sacred=False, digest=None), "sacred"),
    (lambda s: s.update(selection=["gates/suites/test_paged_engine.py::test_namings_and_prefixes_continue_"
                                   "identically"]), "selection"),
])
def test_weakened_manifest_entry_is_flagged(head, edit, what):
    _edit_yaml(head, edit)
    c = check_sacred(head, trusted=ROOT)
    assert not c.ok and any(f"changes {what}" in r for r in c.findings[0].reasons)


def test_deleted_suite_or_broken_manifest_is_flagged(head):
    (head / "gates/suites/test_paged_engine.py").unlink()
    (head / "gates/gates.yaml").write_text("suites: 3\n")
    reasons = check_sacred(head, trusted=ROOT).findings[0].reasons
    assert any("test_paged_engine.py missing" in r for r in reasons)
    assert any("does not load" in r for r in reasons)
