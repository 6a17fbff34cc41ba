"""Synthetic checkpoints: determinism, atomic writes, sharding, the cache, the CLI, and transformers as oracle."""
import json
import threading

import pytest
import torch
from typer.testing import CliRunner

from tools.synth import cache as ckpt_cache
from tools.synth import cli as make_checkpoint_cmd
from engine.loader import load_checkpoint
from nvfp4 import Nvfp4Weight
from engine.presets import layout
from tools.synth.presets import PRESETS, text_config
from tools.synth.checkpoint import make_checkpoint

transformers = pytest.importorskip("transformers")


def _files(path):
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = make_checkpoint(tmp_path / "a", naming="compressed-tensors", seed=7)
    b = make_checkpoint(tmp_path / "b", naming="compressed-tensors", seed=7)
    c = make_checkpoint(tmp_path / "c", naming="compressed-tensors", seed=8)
    assert _files(a) == _files(b)
    assert _files(a)["model.safetensors"] != _files(c)["model.safetensors"]


def test_atomic_write_leaves_no_temp_and_refuses_existing(tmp_path):
    out = make_checkpoint(tmp_path / "ck", layers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    with pytest.raises(FileExistsError):
        make_checkpoint(out, layers=1)
    make_checkpoint(out, layers=1, seed=1, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    (tmp_path / "empty").mkdir()
    assert (make_checkpoint(tmp_path / "empty", layers=1) / "config.json").is_file()


def test_bad_arguments_are_value_errors(tmp_path):
    for kw in ({"preset": "70b"}, {"naming": "gguf"}, {"head": "int8"}, {"prefix": "transformer."},
               {"quant_config": "yaml"}):
        with pytest.raises(ValueError):
            make_checkpoint(tmp_path / "x", **kw)


def test_sharded_with_index(tmp_path):
    out = make_checkpoint(tmp_path / "ck", max_shard_bytes=150_000, naming="modelopt")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((out / s).is_file() for s in shards)
    assert not (out / "model.safetensors").exists()
    one = load_checkpoint(make_checkpoint(tmp_path / "one", naming="modelopt"))
    many = load_checkpoint(out)
    for k, w in one.linears.items():
        assert torch.equal(w.packed, many.linears[k].packed), k


def test_27b_preset_matches_published_dims():
    cfg = text_config(PRESETS["27b"], layers=4)
    conf = transformers.Qwen3_5TextConfig(**cfg)
    assert (conf.hidden_size, conf.intermediate_size, conf.vocab_size) == (5120, 17408, 248320)
    assert (conf.num_attention_heads, conf.num_key_value_heads, conf.head_dim) == (24, 4, 256)
    assert (conf.linear_num_key_heads, conf.linear_num_value_heads, conf.linear_key_head_dim) == (16, 48, 128)
    assert PRESETS["27b"].num_hidden_layers == 64
    shapes = {s.name: s.shape for s in layout(cfg)}
    assert shapes["layers.0.linear_attn.in_proj_qkv"] == (2 * 2048 + 6144, 5120)
    assert shapes["layers.3.self_attn.q_proj"] == (24 * 256 * 2, 5120)
    assert all(s.shape[1] % 16 == 0 for s in layout(cfg) if s.kind == "linear")


def _hf_model(ck):
    """transformers' Qwen3_5ForCausalLM holding the checkpoint's dequantized weights (strict load)."""
    cfg = transformers.Qwen3_5TextConfig(**ck.config)
    from gates.suites.support import reference_modeling

    model = reference_modeling().Qwen3_5ForCausalLM(cfg).float().eval()
    sd = {("lm_head" if k == "lm_head" else f"model.{k}") + ".weight":
          w.dequantize(torch.float32) if isinstance(w, Nvfp4Weight) else w.float() for k, w in ck.linears.items()}
    sd |= {f"model.{k}": t.float() for k, t in ck.tensors.items()}
    if ck.head_kind == "tied":
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    return model


@pytest.mark.parametrize("head", ["nvfp4", "tied"])
def test_transformers_runs_it_with_real_logit_margins(tmp_path, head):
    ck = load_checkpoint(make_checkpoint(tmp_path / "ck", naming="compressed-tensors", head=head, seed=3))
    model = _hf_model(ck)
    ids = torch.randint(0, ck.config["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    rms = [float(h.pow(2).mean().sqrt()) for h in out.hidden_states]
    assert all(0.3 < r < 3.0 for r in rms), rms  # O(1) through the layers
    top2 = out.logits.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).flatten()
    assert 1.0 < float(out.logits.std()) < 10.0
    assert float(margin.median()) > 0.2  # greedy is decided, not a coin toss
    assert float((margin < 1e-3).float().mean()) < 0.02
    assert out.logits.argmax(-1).unique().numel() > 20


def test_cached_checkpoint_builds_once_and_survives_a_race(tmp_path, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path / "cache"))
    results, errors = [], []

    def worker():
        try:
            results.append(ckpt_cache.cached_checkpoint(naming="compressed-tensors", head="bf16", layers=1))
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert results[0].parent == tmp_path / "cache"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].name]  # no temp dirs left
    assert ckpt_cache.cached_checkpoint(naming="compressed-tensors", head="bf16", layers=1) == results[0]
    assert ckpt_cache.cache_key(seed=1) != ckpt_cache.cache_key(seed=2)
    with pytest.raises(TypeError):
        ckpt_cache.cache_key(out="x")


def test_cli_make_checkpoint(tmp_path):
    app = make_checkpoint_cmd.app  # python -m tools.synth
    out = tmp_path / "ck"
    res = CliRunner().invoke(app, ["--out", str(out), "--naming", "compressed-tensors",
                                   "--head", "tied", "--seed", "2", "--layers", "1",
                                   "--prefix", "model.language_model."])
    assert res.exit_code == 0, res.output
    ck = load_checkpoint(out)
    assert (ck.naming, ck.head_kind, ck.prefix) == ("compressed-tensors", "tied", "model.language_model.")
    res = CliRunner().invoke(app, ["--out", str(out)])
    assert res.exit_code == 2 and "exists" in res.output


@pytest.mark.parametrize("prefix", ["model.", "model.language_model."])
def test_config_json_loads_in_transformers(tmp_path, prefix):
    out = make_checkpoint(tmp_path / "ck", naming="modelopt", quant_config="inline", prefix=prefix, head="tied")
    conf = transformers.AutoConfig.from_pretrained(out)
    text = conf.get_text_config()
    assert type(text).__name__ == "Qwen3_5TextConfig"
    assert type(conf).__name__ == ("Qwen3_5TextConfig" if prefix == "model." else "Qwen3_5Config")
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert text.rope_parameters["partial_rotary_factor"] == 0.25 and text.tie_word_embeddings
    assert load_checkpoint(out).config["hidden_size"] == text.hidden_size == 128


def test_chunked_synthesis_equals_whole_tensor_quantization(monkeypatch):
    """Row chunks (how the 27b preset stays in memory) give the same bytes as quantizing the whole
    drawn weight at once with the reference `nvfp4.quantize`."""
    import nvfp4
    from tools.synth import checkpoint as synth
    from engine.presets import TensorSpec
    monkeypatch.setattr(synth, "CHUNK_ELEMS", 3 * 256)  # 3 rows per chunk, a ragged last chunk
    spec = TensorSpec("layers.0.mlp.up_proj", (20, 256), "linear", "in")
    cfg = {"hidden_size": 256, "num_hidden_layers": 2}
    q = synth.quantized_linear(spec, cfg, seed=9)
    std = synth.init_std(spec, cfg, tied=False)
    whole = torch.cat([std * synth._draw(9, spec.name, i, (r1 - r0, 256))
                       for i, r0, r1 in synth._row_chunks(spec.shape)])
    assert len(list(synth._row_chunks(spec.shape))) == 7
    ref = nvfp4.quantize(whole, global_scale=q.global_scale)
    assert torch.equal(ref.packed, q.packed) and torch.equal(ref.block_scale.float(), q.block_scale.float())
    assert float(whole.abs().max()) <= synth.CLIP_SIGMAS * std  # the global scale's amax bound holds
    assert nvfp4.reciprocal_exact(q.global_scale)


def test_threads_do_not_change_a_byte(tmp_path, monkeypatch):
    """Chunks drawn and quantized on a pool (small chunks: many per tensor, out of order) give the
    bytes of one thread; a bad thread count is refused by name."""
    from tools.synth import checkpoint as synth
    monkeypatch.setattr(synth, "CHUNK_ELEMS", 1 << 10)
    outs = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("REGATE_SYNTH_THREADS", threads)
        outs[threads] = _files(make_checkpoint(tmp_path / threads, seed=3))
    assert outs["1"] == outs["3"]
    monkeypatch.setenv("REGATE_SYNTH_THREADS", "0")
    with pytest.raises(ValueError, match="REGATE_SYNTH_THREADS"):
        make_checkpoint(tmp_path / "bad", seed=3)
