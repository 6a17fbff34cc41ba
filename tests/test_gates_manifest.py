"""gates.manifest: the real gates.yaml loads; every malformed key is named in the error."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gates.manifest import ManifestError, Suite, load_manifest, parse_manifest, suite_digest

ROOT = Path(__file__).resolve().parents[1]


def _good() -> dict:
    return {
        "mutations": "off",
        "suites": [
            {"name": "a", "selection": ["gates/suites/test_a.py"], "sacred": True, "needs": ["cpu"],
             "timeout_s": 60, "census": {"tests": 2, "checks": 5}, "digest": "sha256:ab"},
            {"name": "b", "selection": ["gates/suites/test_b.py::test_x", "-k", "fast"], "sacred": False,
             "needs": ["cuda"], "timeout_s": 1.5, "census": {"tests": 1, "checks": 1}},
        ],
    }


def test_real_manifest_loads_with_every_suite_of_the_issue():
    m = load_manifest(ROOT)
    assert set(m.names()) == {"paged_engine", "dense_lmhead_fp4", "paged_forward", "packed_gemm", "cuda_engine"}
    assert [s.name for s in m.sacred()] == ["paged_engine", "cuda_engine"]
    assert m.suite("cuda_engine").needs == ("cuda",)
    assert m.mutations in ("off", "on_gate")
    for s in m.suites:
        assert all((ROOT / f).is_file() for f in s.files), s.name
    assert m.suite("packed_gemm").needs == ("cuda",)


def test_parse_fields_and_defaults():
    m = parse_manifest(_good())
    a, b = m.suites
    assert a == Suite("a", ("gates/suites/test_a.py",), True, ("cpu",), 60.0, 2, 5,
                      ("gates/suites/test_a.py",), "sha256:ab")
    assert b.files == ("gates/suites/test_b.py",)  # node ids and options are not files
    assert b.digest is None
    with pytest.raises(KeyError, match="no suite 'zz'"):
        m.suite("zz")


def test_bare_yaml_off_reads_as_off():
    raw = yaml.safe_load("mutations: off\nsuites: []")
    assert raw["mutations"] is False
    good = _good()
    good["mutations"] = raw["mutations"]
    assert parse_manifest(good).mutations == "off"


@pytest.mark.parametrize("edit, key", [
    (lambda d: d.update(mutations="always"), "mutations"),
    (lambda d: d.update(suites=[]), "suites"),
    (lambda d: d["suites"][1].update(timeout_s=0), "suites[1].timeout_s"),
    (lambda d: d["suites"][1].update(timeout_s=True), "suites[1].timeout_s"),
    (lambda d: d["suites"][0]["census"].update(tests=0), "suites[0].census.tests"),
    (lambda d: d["suites"][0]["census"].update(checks="many"), "suites[0].census.checks"),
    (lambda d: d["suites"][0]["census"].pop("checks"), "suites[0].census: missing key 'checks'"),
    (lambda d: d["suites"][0].pop("digest"), "suites[0].digest"),
    (lambda d: d["suites"][0].update(digest="md5:1"), "suites[0].digest"),
    (lambda d: d["suites"][1].update(needs=["tpu"]), "suites[1].needs[0]"),
    (lambda d: d["suites"][1].update(sacred="yes"), "suites[1].sacred"),
    (lambda d: d["suites"][1].update(selection="x.py"), "suites[1].selection"),
    (lambda d: d["suites"][1].update(name="a"), "suites[1].name"),
    (lambda d: d["suites"][1].update(censu=1), "suites[1]: unknown key 'censu'"),
    (lambda d: d["suites"][1].pop("needs"), "suites[1]: missing key 'needs'"),
])
def test_validation_errors_name_the_key(edit, key):
    d = copy.deepcopy(_good())
    edit(d)
    with pytest.raises(ManifestError) as e:
        parse_manifest(d, "where.yaml")
    assert str(e.value).startswith("where.yaml: ")
    assert key in str(e.value)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ManifestError, match="gates.yaml: not found"):
        load_manifest(tmp_path)
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "gates.yaml").write_text("suites: [\n")
    with pytest.raises(ManifestError, match="gates.yaml: not valid YAML"):
        load_manifest(tmp_path)


def test_suite_digest_changes_with_content_name_and_deletion(tmp_path):
    for name in ("x.py", "y.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    s = Suite("s", ("x.py",), True, ("cpu",), 1.0, 1, 1, ("y.py", "x.py"), None)
    d0 = suite_digest(tmp_path, s)
    assert d0.startswith("sha256:") and d0 == suite_digest(tmp_path, s)
    (tmp_path / "x.py").write_text("# x.py \n")
    d1 = suite_digest(tmp_path, s)
    assert d1 != d0
    (tmp_path / "x.py").unlink()
    assert suite_digest(tmp_path, s) not in (d0, d1)


def test_real_sacred_digest_is_recorded():
    """The recorded digest must match the files as committed (re-record with `python -m gates.manifest`)."""
    for s in load_manifest(ROOT).sacred():
        assert suite_digest(ROOT, s) == s.digest, f"{s.name}: run `python -m gates.manifest` and record it"
