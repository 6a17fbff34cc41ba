"""A head's tree on PYTHONPATH must never borrow a module it lacks from the installed regate.

setup.sh installs regate editable in `compat` mode (a .pth path entry). The default editable mode
installs an import hook that answers for ANY submodule of regate's packages, so a head missing
`engine/cli.py` would silently run this checkout's copy: the gate would test other code than
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
    missing = _import_in_tree(tmp_path, "engine.cli")
    assert missing.returncode != 0, f"borrowed from the install: {missing.stdout.strip()}"
    assert "No module named 'engine.cli'" in missing.stderr


def _resolve_in_tree(tree) -> subprocess.CompletedProcess:
    """The box's resolver as Tree.checkpoint runs it: the head's isolated Python, its tree first."""
    from orchestrator.box.tree import RESOLVE
    from orchestrator.pyboot import isolated_python

    cmd = isolated_python(sys.executable, [str(tree)], "-c", RESOLVE, '{"preset": "tiny"}')
    return subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=60)


def _module(tree, rel: str, text: str) -> None:
    path = tree / rel
    for parent in reversed(path.relative_to(tree).parents[:-1]):
        (tree / parent).mkdir(exist_ok=True)
        (tree / parent / "__init__.py").touch()
    path.write_text(text)


def test_the_checkpoint_resolver_takes_the_trees_synthesis_tool_or_an_older_trees_engine_cache(tmp_path):
    """A tree from before synthesis moved to tools/ (a compare's older base) resolves through its
    engine/ckpt_cache.py; a tree with tools/synth/cache.py through that; a tool that fails to import
    something else says so instead of falling back."""
    import json

    _module(tmp_path, "engine/ckpt_cache.py", "def cached_checkpoint(**p): return 'old'\n")
    assert json.loads(_resolve_in_tree(tmp_path).stdout) == {"path": "old"}
    _module(tmp_path, "tools/synth/cache.py", "def cached_checkpoint(**p): return 'new:' + p['preset']\n")
    assert json.loads(_resolve_in_tree(tmp_path).stdout) == {"path": "new:tiny"}
    _module(tmp_path, "tools/synth/cache.py", "import no_such_dependency\n")
    broken = _resolve_in_tree(tmp_path)
    assert broken.returncode != 0 and "No module named 'no_such_dependency'" in broken.stderr
