"""How regate starts a Python process whose import path it chooses: the box harness, the keeper, and
every Python process of a head.

`python -I -S -c BOOT SPEC ...`: -I ignores PYTHON* variables and the user's site, -S skips `site`, so
no .pth file and no sitecustomize/usercustomize is loaded (a head that ships one, or a checkout that an
editable install puts on every path, never runs before the harness's own code); BOOT then sets the
import path explicitly (SPEC, JSON) and runs `-m MODULE`, `-c CODE` or a script, as python would. Standard library only: the box's Ray worker imports this without importing the box side.
"""
from __future__ import annotations

import json
import os
import sys

REGATE_PACKAGES = ("orchestrator", "engine", "kernels", "gates", "grids", "nvfp4", "tools")

BOOT = """import json, runpy, sys
spec = json.loads(sys.argv[1])
stdlib = list(sys.path)
sys.path[:] = stdlib + spec["libs"]
for name in spec["preload"]:
    __import__(name)
sys.path[:] = stdlib + spec["paths"] + spec["libs"]
rest = sys.argv[2:]
if rest[0] == "-m":
    sys.argv = [rest[1], *rest[2:]]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
elif rest[0] == "-c":
    sys.argv = ["-c", *rest[2:]]
    exec(compile(rest[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
else:
    sys.argv = rest
    runpy.run_path(rest[0], run_name="__main__")
"""


def isolated_python(python: str, paths: list[str], *args: str, preload: tuple[str, ...] = ()) -> list[str]:
    """`python` started with its standard library, then exactly `paths`, then the installed libraries
    on its import path (BOOT). The standard library comes first, so a tree's `json.py` shadows nothing;
    `preload` names modules imported from the installed libraries before `paths` join the path (a
    suite's `pytest`, which a head's `pytest.py` must not replace)."""
    spec = {"paths": list(paths), "libs": library_paths(), "preload": list(preload)}
    return [python, "-I", "-S", "-c", BOOT, json.dumps(spec), *args]


def library_paths(path: list[str] | None = None) -> list[str]:
    """This process's import path less every folder that holds a regate package (a checkout, a head's
    tree, the driver's cwd): the installed libraries (site-packages, a --target dir) a head needs."""
    out = []
    for p in sys.path if path is None else path:
        if not p or not os.path.isdir(p) or p in out:
            continue
        if any(os.path.isfile(os.path.join(p, pkg, "__init__.py")) for pkg in REGATE_PACKAGES):
            continue
        out.append(p)
    return out
