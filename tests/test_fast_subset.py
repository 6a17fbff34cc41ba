"""`pytest -m "not slow"`: a test measured at SLOW_S or more (tests/durations.json) is marked slow;
`--store-durations` records the wall times that decide it. Run on a copy of this conftest in a scratch
folder, so the real durations file is never touched."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300)


def test_measured_slow_tests_leave_the_fast_subset_and_store_durations_records_them(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "test_x.py").write_text("import time\n\ndef test_quick():\n    pass\n\n"
                                        "def test_sleepy():\n    time.sleep(1.1)\n")
    stored = _pytest(tmp_path, "--store-durations")
    assert stored.returncode == 0, stored.stdout + stored.stderr
    durations = json.loads((tmp_path / "durations.json").read_text())
    assert durations["test_x.py::test_sleepy"] >= 1.0 > durations["test_x.py::test_quick"]
    fast = _pytest(tmp_path, "-m", "not slow", "--collect-only")
    assert "test_quick" in fast.stdout and "test_sleepy" not in fast.stdout and "1 deselected" in fast.stdout
