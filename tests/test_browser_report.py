"""A rendered report opened in a real browser: headless Chromium (Debian's `chromium`, which .ci/run
installs). No console errors, the Established and Owed sections and the plots present in the DOM the
browser built, and a screenshot saved under the test's tmp dir.

Console messages are read from Chromium's own log (`--enable-logging=stderr --v=0` prints each as
`INFO:CONSOLE...] "message", source: ...`); a report has no script, so any console message is a fault.
The detector is itself checked on a page that does log an error, so this test can fail.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

import report_records as rr
from orchestrator.report.render import render_run

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0")
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"  # fresh per launch
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120, check=True)


def console_messages(stderr: str) -> list[str]:
    return CONSOLE.findall(stderr)


class Dom(HTMLParser):
    """Section ids, and the number of <svg> with drawn paths inside each section."""

    def __init__(self):
        super().__init__()
        self.sections, self.svgs, self._section, self._paths = [], {}, None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self._section = dict(attrs).get("id")
            self.sections.append(self._section)
        elif tag == "svg":
            self._paths = 0
        elif tag == "path":
            self._paths += 1

    def handle_endtag(self, tag):
        if tag == "svg" and self._paths:
            self.svgs[self._section] = self.svgs.get(self._section, 0) + 1


def test_the_console_detector_sees_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><p>x</p><script>console.error("regate-probe"); nope();</script>')
    msgs = console_messages(chromium(tmp_path, "--dump-dom", bad.as_uri()).stderr)
    assert any("regate-probe" in m for m in msgs) and any("nope is not defined" in m for m in msgs)


def test_report_opens_in_chromium_without_console_errors(tmp_path):
    page = render_run(rr.seed_record(), tmp_path / "reports")
    binding = render_run(rr.record(run_id="r-bind", grid=rr.grid(rr.binding_verdict())), tmp_path / "reports")
    for path, plot_section in ((page, "owed"), (binding, "established")):
        run = chromium(tmp_path, "--dump-dom", path.as_uri())
        assert console_messages(run.stderr) == [], f"{path.name}: console messages in the browser"
        dom = Dom()
        dom.feed(run.stdout)
        assert dom.sections == ["verdict", "provenance", "gates", "established", "owed", "residency", "raw"]
        assert dom.svgs.get(plot_section, 0) >= 1, f"{path.name}: no drawn plot under {plot_section}"
        assert "dequant legs disagree by 7.9%" in run.stdout or path == binding

    shot = tmp_path / "report.png"
    chromium(tmp_path, "--window-size=1200,2400", "--hide-scrollbars", f"--screenshot={shot}", page.as_uri())
    from matplotlib.image import imread  # a PNG reader already in the environment

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1200)
    assert pixels[..., :3].std() > 0.05, "the screenshot is blank"
