"""gates.pins: precise edits confined to a function, patches without fuzz, STALE never KILLED."""
from __future__ import annotations

import pytest

from gates.pins import Edit, PinError, PinStale, apply_edit, apply_pin, load_pin, load_pins

SRC = '''\
def load_head(w):
    w.keep = True
    return w


class Loader:
    def load_tower(self, w):
        w.keep = False
        return w
'''


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SRC)
    return tmp_path


def test_edit_confined_to_function(tree):
    # `return w` occurs twice in the file, once per function: the function makes it unique.
    apply_edit(Edit("pkg/mod.py", "        return w\n", "        w.keep = True\n        return w\n",
                    function="Loader.load_tower"), tree)
    text = (tree / "pkg" / "mod.py").read_text()
    assert text.count("w.keep = True") == 2
    assert text.index("w.keep = False") < text.rindex("w.keep = True")


@pytest.mark.parametrize("edit, why", [
    (Edit("pkg/gone.py", "x", "y"), "file is gone"),
    (Edit("pkg/mod.py", "w.keep = maybe", "y"), "search text is gone"),
    (Edit("pkg/mod.py", "return w", "return None"), "occurs 2 times"),
    (Edit("pkg/mod.py", "return w", "return None", function="load_tail"), "load_tail() is gone"),
    (Edit("pkg/mod.py", "w.keep = False", "w.keep = 1", function="load_head"), "search text is gone"),
])
def test_stale_when_target_gone_or_ambiguous(tree, edit, why):
    before = (tree / "pkg" / "mod.py").read_text()
    with pytest.raises(PinStale, match=why.replace("(", r"\(").replace(")", r"\)")):
        apply_edit(edit, tree)
    assert (tree / "pkg" / "mod.py").read_text() == before


def _write_pin(tmp_path, name, body):
    d = tmp_path / "gates" / "mutations"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(body)
    return p


PATCH = '''\
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,3 +1,3 @@
 def load_head(w):
-    w.keep = True
+    w.keep = False
     return w
'''


def test_patch_pin_applies_then_goes_stale(tree):
    body = "suite: s\nexpected_min: 1\nwhy: flips the head flag\npatch: |\n" + "".join(
        "  " + line + "\n" for line in PATCH.splitlines())
    pin = load_pin(_write_pin(tree, "flip", body))
    apply_pin(pin, tree)
    assert "w.keep = False\n    return w\n\n\nclass" in (tree / "pkg" / "mod.py").read_text()
    with pytest.raises(PinStale, match="patch does not apply"):
        apply_pin(pin, tree)  # already applied: the context no longer matches


def test_load_pins_by_name_and_errors(tmp_path):
    _write_pin(tmp_path, "a", "suite: s\nexpected_min: 2\nwhy: w\nedits:\n"
                              "  - {file: f.py, search: 'x = 1', replace: 'x = 2', function: g}\n")
    _write_pin(tmp_path, "b", "suite: s\nexpected_min: 1\nwhy: w\nselect: [t.py::test_a]\n"
                              "edits: [{file: f.py, search: a, replace: b}]\n")
    pins = load_pins(tmp_path)
    assert [p.name for p in pins] == ["a", "b"]
    assert pins[0].edits == (Edit("f.py", "x = 1", "x = 2", "g"),) and pins[0].expected_min == 2
    assert pins[1].select == ("t.py::test_a",)
    assert [p.name for p in load_pins(tmp_path, ["b"])] == ["b"]
    with pytest.raises(PinError, match="no pin named zz"):
        load_pins(tmp_path, ["zz"])


@pytest.mark.parametrize("body, msg", [
    ("suite: s\nwhy: w\nedits: [{file: f, search: a, replace: b}]\n", "missing key 'expected_min'"),
    ("suite: s\nexpected_min: 0\nwhy: w\nedits: [{file: f, search: a, replace: b}]\n", "expected_min"),
    ("suite: s\nexpected_min: 1\nwhy: w\n", "exactly one of 'edits' and 'patch'"),
    ("suite: s\nexpected_min: 1\nwhy: w\nedits: [{file: f, search: a, replace: a}]\n", "differ from replace"),
    ("suite: s\nexpected_min: 1\nwhy: w\nedits: [{file: f, search: a}]\n", "edits[0].replace"),
    ("suite: s\nexpected_min: 1\nwhy: w\nedits: [{file: f, search: a, replace: b, fn: g}]\n", "unknown key"),
    ("suite: s\nexpected_min: 1\nwhy: w\nedit: []\n", "unknown key 'edit'"),
    ("- a\n", "expected a mapping"),
])
def test_pin_validation_names_the_key(tmp_path, body, msg):
    p = _write_pin(tmp_path, "bad", body)
    with pytest.raises(PinError) as e:
        load_pin(p)
    assert str(p) in str(e.value) and msg in str(e.value)
