"""The loader on good checkpoints: both namings, all heads, both prefixes, quant-config forms."""
import pytest
import torch

from tools.synth.cache import cached_checkpoint
from engine.loader import load_checkpoint
from nvfp4 import Nvfp4Weight
from tests.loader_helpers import edit_json, edit_tensors, fresh, module_to_bf16


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path_factory.getbasetemp() / "regate-cache"))


@pytest.mark.parametrize("prefix", ["model.", "model.language_model."])
@pytest.mark.parametrize("head", ["nvfp4", "bf16", "tied"])
@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_every_naming_head_and_prefix(naming, head, prefix):
    ck = load_checkpoint(cached_checkpoint(naming=naming, head=head, prefix=prefix))
    assert (ck.naming, ck.head_kind, ck.prefix) == (naming, head, prefix)
    assert ck.config["model_type"] == "qwen3_5_text"
    tower = {k: w for k, w in ck.linears.items() if k != "lm_head"}
    # 3 Gated DeltaNet layers (5 Linears + 3 MLP), 1 full-attention layer (q/k/v/o + 3 MLP)
    assert len(tower) == 3 * 8 + 1 * 7
    assert all(isinstance(w, Nvfp4Weight) and w.naming == naming for w in tower.values())
    assert "layers.3.self_attn.q_proj" in tower and "layers.0.linear_attn.in_proj_qkv" in tower
    assert {"embed_tokens.weight", "norm.weight", "layers.0.linear_attn.A_log"} <= set(ck.tensors)
    assert not any(k.startswith("model.") for k in (*ck.linears, *ck.tensors))
    head_w = ck.linears.get("lm_head")
    assert isinstance(head_w, {"nvfp4": Nvfp4Weight, "bf16": torch.Tensor, "tied": type(None)}[head])
    if head == "bf16":
        assert head_w.dtype == torch.bfloat16 and head_w.shape == (512, 128)
    assert not any(isinstance(w, Nvfp4Weight) and (w.keep_dequant_b or w.dequant_b is not None)
                   for w in ck.linears.values())


@pytest.mark.parametrize("head", ["nvfp4", "bf16"])
def test_both_namings_dequantize_bit_identically(head):
    mo = load_checkpoint(cached_checkpoint(naming="modelopt", head=head, seed=4))
    ct = load_checkpoint(cached_checkpoint(naming="compressed-tensors", head=head, seed=4))
    assert mo.linears.keys() == ct.linears.keys() and mo.tensors.keys() == ct.tensors.keys()
    for k, w in mo.linears.items():
        if isinstance(w, Nvfp4Weight):
            assert w.global_scale == ct.linears[k].global_scale, k
            assert w.input_scale == ct.linears[k].input_scale, k
            assert torch.equal(w.dequantize(torch.float32), ct.linears[k].dequantize(torch.float32)), k
        else:
            assert torch.equal(w, ct.linears[k]), k
    assert all(torch.equal(t, ct.tensors[k]) for k, t in mo.tensors.items())


def test_legacy_and_inline_modelopt_configs_load_the_same():
    legacy = load_checkpoint(cached_checkpoint(quant_config="legacy", head="bf16"))
    inline = load_checkpoint(cached_checkpoint(quant_config="inline", head="bf16"))
    assert (legacy.path / "hf_quant_config.json").is_file() and not (inline.path / "hf_quant_config.json").exists()
    for k, w in legacy.linears.items():
        other = inline.linears[k]
        assert torch.equal(w.dequantize() if isinstance(w, Nvfp4Weight) else w,
                           other.dequantize() if isinstance(other, Nvfp4Weight) else other), k


@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_w4a4_only_when_opted_in_and_never_for_the_head(naming):
    path = cached_checkpoint(naming=naming, head="nvfp4")
    ck = load_checkpoint(path)
    assert not ck.w4a4  # W4A16 by default even though input scales are carried
    assert ck.linears["layers.0.mlp.up_proj"].input_scale is not None
    assert ck.linears["lm_head"].input_scale is None
    assert load_checkpoint(path, w4a4=True).w4a4  # the engine's option nvfp4_w4a4


def test_compressed_tensors_head_is_never_mistaken_for_tied(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors", head="nvfp4")
    edit_json(ck / "config.json", lambda c: c.update(tie_word_embeddings=True))
    loaded = load_checkpoint(ck)
    assert loaded.head_kind == "nvfp4" and isinstance(loaded.linears["lm_head"], Nvfp4Weight)


def test_modelopt_exclude_patterns_keep_modules_bf16(tmp_path):
    ck = fresh(tmp_path, naming="modelopt", head="bf16")
    downs = [f"model.layers.{i}.mlp.down_proj" for i in range(4)]
    edit_tensors(ck, lambda t: [module_to_bf16(t, m, "modelopt") for m in downs])
    edit_json(ck / "hf_quant_config.json", lambda c: c["quantization"]["exclude_modules"].append("*mlp.down_proj"))
    loaded = load_checkpoint(ck)
    for i in range(4):
        w = loaded.linears[f"layers.{i}.mlp.down_proj"]
        assert isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and w.shape == (128, 256)
    assert isinstance(loaded.linears["layers.0.mlp.up_proj"], Nvfp4Weight)


def test_compressed_tensors_regex_ignore(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors", head="bf16")
    edit_tensors(ck, lambda t: module_to_bf16(t, "model.layers.1.linear_attn.in_proj_b", "compressed-tensors"))
    edit_json(ck / "config.json", lambda c: c["quantization_config"]["ignore"].append("re:.*1\\.linear_attn\\.in_proj_b"))
    loaded = load_checkpoint(ck)
    assert isinstance(loaded.linears["layers.1.linear_attn.in_proj_b"], torch.Tensor)
    assert isinstance(loaded.linears["layers.0.linear_attn.in_proj_b"], Nvfp4Weight)


def test_mixed_precision_per_layer_entries(tmp_path):
    ck = fresh(tmp_path, naming="modelopt", head="nvfp4")
    quant = (ck / "hf_quant_config.json")
    edit_json(quant, lambda c: c["quantization"]["quantized_layers"].pop("model.layers.2.mlp.gate_proj"))
    edit_tensors(ck, lambda t: module_to_bf16(t, "model.layers.2.mlp.gate_proj", "modelopt"))
    loaded = load_checkpoint(ck)
    assert isinstance(loaded.linears["layers.2.mlp.gate_proj"], torch.Tensor)
    assert loaded.quant.per_module["lm_head"] == "W4A16_NVFP4"
    assert isinstance(loaded.linears["lm_head"], Nvfp4Weight) and loaded.head_kind == "nvfp4"


def test_plain_nvfp4_algo_quantizes_the_head_too(tmp_path):
    ck = fresh(tmp_path, naming="modelopt", head="nvfp4")
    edit_json(ck / "hf_quant_config.json", lambda c: c.update(
        quantization={"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}))
    loaded = load_checkpoint(ck)
    assert isinstance(loaded.linears["lm_head"], Nvfp4Weight)
    assert all(isinstance(w, Nvfp4Weight) for w in loaded.linears.values())


def test_tensors_are_memory_mapped_not_read_whole(tmp_path):
    """Asking for one tensor of a large file does not read the file into memory. (Packed bytes, the bulk
    of an NVFP4 checkpoint, stay mapped until used; a floating-point tensor is read once at load by
    the finiteness check.)"""
    psutil = pytest.importorskip("psutil")
    from safetensors.torch import save_file

    from engine.safetensors_io import TensorSource
    save_file({"big": torch.zeros(192 * 2**20, dtype=torch.uint8), "small": torch.ones(16)},
              str(tmp_path / "model.safetensors"))
    proc = psutil.Process()
    before = proc.memory_info().rss
    src = TensorSource(tmp_path)
    small = src.get("small", ("F32",), (16,))
    big = src.get("big", ("U8",), (192 * 2**20,))
    grown = proc.memory_info().rss - before
    assert small.sum() == 16 and big.numel() == 192 * 2**20
    assert grown < 64 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB for a 192 MiB file"
    src.close()
