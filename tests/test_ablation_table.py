"""tools/ablation/table.py: what each ablated part saves the step, and a part's link apart from its work."""
from __future__ import annotations

import json

import pytest

from tools.ablation import table as ablation_table


def _line(ablated: str | None, leg: int, batch: int, ms: float) -> str:
    variant = f"ablate={ablated or ''}"
    return json.dumps({"layers": 64, "variant": variant, "leg": leg, "params": {"batch": batch}, "ablated": ablated,
                       "decode_tok_s": 1000 * batch / ms, "prefill_ms": 30.0, "ms_per_step": ms})


def test_savings_and_the_split_of_a_part_into_its_link_and_its_work(tmp_path, capsys):
    steps = {None: (6.40, 6.44), "norm": (5.80, 5.82), "norm:empty": (6.10, 6.12), "tower:read": (5.10, 5.06)}
    lines = [_line(a, leg, 1, ms[leg]) for leg in (0, 1) for a, ms in steps.items()]
    lines.append(_line(None, 0, 16, 8.7))
    path = tmp_path / "ab-benches.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ablation_table.main([str(path)])
    out = capsys.readouterr().out.splitlines()
    b1, b16 = json.loads(out[-1])["ablation"]
    assert b1["batch"] == 1 and b1["base"]["ms_per_step"] == pytest.approx(6.42)
    assert b1["ablated"]["norm"]["saves_ms"] == pytest.approx(6.42 - 5.81)
    assert b1["ablated"]["tower:read"]["ms_per_step"] == pytest.approx(5.08)
    assert b1["splits"] == {"norm": {"link_ms": pytest.approx(6.11 - 5.81), "work_ms": pytest.approx(6.42 - 6.11)}}
    assert b16 == {"batch": 16, "base": {"ms_per_step": 8.7, "legs": [8.7]}, "ablated": {}, "splits": {}}
    assert out[0] == "batch 1: the real engine 6.420 ms/step (legs 6.400, 6.440)"
    assert "  norm: link +0.300 ms (empty launches - none), work +0.310 ms (the real engine - empty launches)" in out


def test_without_the_real_engine_there_is_nothing_to_subtract_from(tmp_path):
    path = tmp_path / "ab-benches.jsonl"
    path.write_text(_line("norm", 0, 1, 5.8) + "\n")
    with pytest.raises(SystemExit, match="batch 1: no bench of the real engine"):
        ablation_table.main([str(path)])


def test_bad_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "ablation.jsonl"
    path.write_text(_line(None, 0, 1, 6.4) + "\n{\"variant\": \"ablate=norm\"}\n")
    with pytest.raises(SystemExit, match=r"ablation.jsonl:2: expected a bench line of device_gate.sh ablate"):
        ablation_table.read_lines(path)
    path.write_text("\n")
    with pytest.raises(SystemExit, match="no bench lines"):
        ablation_table.read_lines(path)
