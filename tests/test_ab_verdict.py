"""scripts/ab_verdict.py: an A/B's bench lines judged with the grid's verdict statistics."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ab_verdict.py"
spec = importlib.util.spec_from_file_location("ab_verdict", SCRIPT)
ab_verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_verdict)


def _line(variant: str, leg: int, batch: int, tok_s: float, prefill_ms: float) -> str:
    return json.dumps({"layers": 64, "variant": variant, "leg": leg, "params": {"batch": batch},
                       "decode_tok_s": tok_s, "prefill_ms": prefill_ms, "ms_per_step": 1000 / tok_s})


def test_a_clear_gain_is_established_and_binding_and_overlapping_legs_are_not(tmp_path, capsys):
    lines = []
    for leg, (a, b, c) in enumerate([(100.0, 110.0, 100.4), (100.5, 110.4, 99.9), (100.2, 110.2, 100.6)], 1):
        lines += [_line("X=0", leg, 1, a, 50.0), _line("X=1", leg, 1, b, 50.2 - leg * 0.1),
                  _line("X=2", leg, 1, c, 60.0)]
    path = tmp_path / "ab-benches.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ab_verdict.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    vs = json.loads(out[-1])["ab_verdicts"]
    got = {(v["metric"], v["variant"]): v for v in vs}
    gain = got[("decode", "X=1")]
    assert gain["base"] == "X=0" and gain["direction"]["state"] == "established"
    assert gain["direction"]["winner"] == "X=1" and gain["magnitude"]["state"] == "binding"
    assert gain["magnitude"]["ratio"] == pytest.approx(110.2 / 100.2, rel=1e-9)
    assert got[("decode", "X=2")]["direction"]["state"] == "none"  # the legs overlap
    slower = got[("prefill", "X=2")]  # prefill judged as 1 / ms: 60 ms is slower than 50
    assert slower["direction"]["winner"] == "X=0" and slower["direction"]["state"] == "established"
    assert any("X=1 vs X=0" in line and "direction established" in line for line in out[:-1])


def test_batches_are_judged_apart_and_bad_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "ab.jsonl"
    path.write_text(_line("A", 1, 1, 100, 40) + "\n" + _line("A", 1, 16, 900, 200) + "\n"
                    + _line("B", 1, 16, 950, 210) + "\n")
    vs = ab_verdict.verdicts(ab_verdict.read_lines(path))
    assert {(v["batch"], v["variant"]) for v in vs} == {(16, "B")}  # batch 1 has one variant: nothing to judge
    path.write_text(_line("A", 1, 1, 100, 40) + "\n{\"variant\": \"B\"}\n")
    with pytest.raises(SystemExit, match=r"ab.jsonl:2: expected a bench line"):
        ab_verdict.read_lines(path)
    path.write_text("\n")
    with pytest.raises(SystemExit, match="no bench lines"):
        ab_verdict.read_lines(path)
