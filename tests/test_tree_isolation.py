"""A head's tree on PYTHONPATH must never borrow a module it lacks from the installed regate.

setup.sh installs regate editable in `compat` mode (a .pth path entry). The default editable mode
installs an import hook that answers for ANY submodule of regate's packages, so a head missing
`engine/ckpt_cache.py` would silently run this checkout's copy: the gate would test other code than
the head's. This pins the install mode by its effect.
"""
from __future__ import annotations

import os
import subprocess
import sys


def _import_in_tree(tree, module: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__file__)"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=60)


def test_a_module_missing_from_the_tree_is_not_borrowed(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "errors.py").write_text("HERE = True\n")
    found = _import_in_tree(tmp_path, "engine.errors")
    assert found.returncode == 0 and found.stdout.strip() == str(tmp_path / "engine" / "errors.py")
    missing = _import_in_tree(tmp_path, "engine.ckpt_cache")
    assert missing.returncode != 0, f"borrowed from the install: {missing.stdout.strip()}"
    assert "No module named 'engine.ckpt_cache'" in missing.stderr
