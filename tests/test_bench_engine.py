"""`engine bench` and `engine generate` end to end on the CPU (shape of the output, never wall times)."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from engine.cli import _register_all, app
from engine.commands.bench import SCHEMA_VERSION, run_prompts, synthetic_prompts
from engine.engine import Engine
from engine_oracle import tiny

_register_all()


def test_bench_prints_one_json_line_with_the_schema(monkeypatch):
    monkeypatch.setenv("REGATE_NO_SUCH_SWITCH", "4")  # nothing reads it (a module-level switch would stay set)
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny()), "--batch", "2", "--prompt-len", "5",
                                   "--gen-len", "3", "--iters", "2", "--warmup", "1", "--json"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["schema_version"] == SCHEMA_VERSION
    assert len(r["decode_tok_s_iters"]) == 2 and all(v > 0 for v in r["decode_tok_s_iters"])
    assert min(r["decode_tok_s_iters"]) <= r["decode_tok_s"] <= max(r["decode_tok_s_iters"])
    assert r["ms_per_step"] > 0 and r["prefill_ms"] > 0 and r["peak_rss_bytes"] > 0
    assert r["peak_device_bytes"] == 0  # CPU
    eng = Engine(tiny())
    assert r["bytes_per_decode_step"] == eng.residency()["totals"]["bytes_per_decode_step"]
    assert {"host", "gpu", "driver", "torch", "triton", "head_sha", "tree_dirty", "switches"} <= set(r["meta"])
    assert r["meta"]["switches"]["REGATE_NO_SUCH_SWITCH"] == "4"
    assert all(k.startswith("REGATE_") for k in r["meta"]["switches"])
    assert r["params"]["lm_head"] == "packed" and r["params"]["batch"] == 2
    assert list(r["phases_s"]) == ["start", "imports", "load", "warmup", "runs", "measure"]
    assert all(v >= 0 for v in r["phases_s"].values())
    f = r["floor"]
    assert f["weight_bytes"] == r["bytes_per_decode_step"] and f["box_read_gb_s"] > 0
    assert f["total_bytes"] == f["weight_bytes"] + f["state_bytes"] + f["kv_bytes"]
    assert abs(f["share_of_floor"] - f["floor_ms"] / r["ms_per_step"]) < 1e-12


def test_the_decode_floor_counts_state_once_each_way_and_the_live_kv_once():
    from engine.floor import decode_floor_bytes
    from engine.model.config import ModelConfig

    cfg = ModelConfig.from_dict(json.loads((tiny() / "config.json").read_text()))
    # tiny: 3 Gated DeltaNet layers (Hv 4, Dk = Dv = 32, conv_dim 256, kernel 4), 1 attention layer (Hkv 2, D 32)
    f = decode_floor_bytes(cfg, batch=2, prompt_len=10, gen_len=5, weight_bytes=1000, act_bytes=2)
    state = 2 * 3 * 2 * (4 * 32 * 32 * 4 + 256 * 3 * 2)
    mean_context = 10 + (4 + 1) / 2  # decode steps 1..4 attend over 11..14 tokens
    kv = 2 * 1 * (2 * 2 * 32 * 2) * (mean_context + 1)
    assert f == {"weight_bytes": 1000, "state_bytes": state, "kv_bytes": round(kv), "total_bytes": 1000 + state + round(kv),
                 "mean_context": mean_context}
    # option recurrent_state=bf16 or fp16: the recurrent state's bytes halve, the conv window's stay
    half = decode_floor_bytes(cfg, batch=2, prompt_len=10, gen_len=5, weight_bytes=1000, act_bytes=2, state_bytes=2)
    assert half["state_bytes"] == 2 * 3 * 2 * (4 * 32 * 32 * 2 + 256 * 3 * 2)


def test_bench_refuses_a_run_without_decode_steps():
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny()), "--gen-len", "1", "--json"])
    assert res.exit_code == 2 and "gen-len >= 2" in res.output


def test_one_off_prompts_are_new_and_a_token_shorter_each_run():
    same = [run_prompts(2, 9, 512, 7, i, one_off=False) for i in range(3)]
    assert same[0] == same[1] == same[2] == synthetic_prompts(2, 9, 512, seed=7)
    fresh = [run_prompts(2, 9, 512, 7, i, one_off=True) for i in range(3)]
    assert [len(p[0]) for p in fresh] == [9, 8, 7] and all(len(p) == 2 for p in fresh)
    assert fresh[1] != [p[:8] for p in fresh[0]]  # not a prefix of the run before: drawn anew


def test_bench_with_one_off_prompts_records_it_and_refuses_prompts_too_short(monkeypatch):
    from engine.commands import bench

    seen = []
    real = Engine.generate

    def spy(self, prompts, *args, **kwargs):
        seen.append(tuple(len(p) for p in prompts))
        return real(self, prompts, *args, **kwargs)
    monkeypatch.setattr(Engine, "generate", spy)
    r = bench.run_bench(tiny(), "cpu", "packed", 2, 6, 3, 2, 1, 0, one_off=True)
    assert seen == [(6, 6), (5, 5), (4, 4)] and r["params"]["one_off_prompts"] is True
    res = CliRunner().invoke(app, ["bench", "--model", str(tiny()), "--prompt-len", "3", "--iters", "3",
                                   "--one-off-prompts", "--json"])
    assert res.exit_code == 2 and "prompt-len 3 must be >= warmup + iters = 4" in res.output


def test_synthetic_prompts_are_seeded():
    a = synthetic_prompts(3, 4, 512, seed=7)
    assert a == synthetic_prompts(3, 4, 512, seed=7) != synthetic_prompts(3, 4, 512, seed=8)
    assert all(len(p) == 4 and all(0 <= t < 512 for t in p) for p in a)


def test_generate_cli_matches_the_api():
    res = CliRunner().invoke(app, ["generate", "--model", str(tiny()), "--prompt-ids", "1,2,3", "--prompt-ids",
                                   "4,5", "--max-new", "3", "--lm-head", "dequant", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["tokens"] == Engine(tiny(), lm_head="dequant").generate([[1, 2, 3], [4, 5]], 3)
    assert len(out["topk"][0]) == 3


def test_generate_cli_bad_ids_exit_2():
    res = CliRunner().invoke(app, ["generate", "--model", str(tiny()), "--prompt-ids", "1,x"])
    assert res.exit_code == 2 and "comma-separated integers" in res.output


def test_info_on_a_missing_checkpoint_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(app, ["info", "--model", str(tmp_path / "nope"), "--json"])
    assert res.exit_code == 2 and "config.json" in res.output


def test_git_state_says_when_the_tree_is_not_head(tmp_path):
    import subprocess

    from engine.commands.bench import git_state

    assert git_state(tmp_path) == {"head_sha": None, "tree_dirty": None}  # not a checkout
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "kernel.cu").write_text("v1\n")
    subprocess.run(git + ["add", "kernel.cu"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "c"], cwd=tmp_path, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_state(tmp_path) == {"head_sha": sha, "tree_dirty": False}
    (tmp_path / "kernel.cu").write_text("v2\n")  # a copied-in tree newer than the checkout's HEAD
    assert git_state(tmp_path) == {"head_sha": sha, "tree_dirty": True}


def test_a_process_age_counts_from_its_birth():
    """`phases_s.start`: read from /proc against the boot clock, so a process that slept 0.5 s before
    asking is at least that old, and not older than the test that started it."""
    import subprocess
    import sys
    import time
    t0 = time.monotonic()
    code = "import time; time.sleep(0.5); from engine.commands.bench import since_process_start as s; print(s())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.5 <= age <= time.monotonic() - t0 + 0.05
