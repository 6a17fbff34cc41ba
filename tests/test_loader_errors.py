"""Every bad input is a CheckpointError whose message names the file and the tensor/field."""
import json
import os
import threading

import pytest
import torch

from engine.errors import CheckpointError
from engine.loader import load_checkpoint
from tests.loader_helpers import edit_json, edit_tensors, fresh, module_to_bf16

UP = "model.layers.0.mlp.up_proj"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("REGATE_CACHE", str(tmp_path_factory.getbasetemp() / "regate-cache"))


def _fails(ck, *needles):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ck)
    msg = str(info.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_missing_config(tmp_path):
    ck = fresh(tmp_path)
    (ck / "config.json").unlink()
    _fails(ck, "config.json", str(ck))


def test_wrong_model_type(tmp_path):
    ck = fresh(tmp_path)
    edit_json(ck / "config.json", lambda c: c.update(model_type="llama"))
    _fails(ck, "config.json", "'llama'", "qwen3_5_text")


def test_unknown_quant_algo(tmp_path):
    ck = fresh(tmp_path, head="bf16")
    edit_json(ck / "hf_quant_config.json", lambda c: c["quantization"].update(quant_algo="FP8"))
    _fails(ck, "hf_quant_config.json", "quant_algo", "'FP8'")


def test_unknown_per_layer_quant_algo(tmp_path):
    ck = fresh(tmp_path, head="nvfp4")
    edit_json(ck / "hf_quant_config.json",
              lambda c: c["quantization"]["quantized_layers"][UP].update(quant_algo="INT4_AWQ"))
    _fails(ck, "hf_quant_config.json", UP, "'INT4_AWQ'")


def test_unknown_compressed_tensors_format(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors")
    edit_json(ck / "config.json", lambda c: [g.update(format="int-quantized")
                                             for g in c["quantization_config"]["config_groups"].values()])
    _fails(ck, "config.json", "quantization_config", "'int-quantized'")


def test_unknown_quant_method(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors")
    edit_json(ck / "config.json", lambda c: c["quantization_config"].update(quant_method="gptq"))
    _fails(ck, "config.json", "'gptq'")


@pytest.mark.parametrize("naming,suffix", [("modelopt", "weight_scale"), ("modelopt", "weight_scale_2"),
                                           ("compressed-tensors", "weight_packed"),
                                           ("compressed-tensors", "weight_global_scale")])
def test_missing_tensor(tmp_path, naming, suffix):
    ck = fresh(tmp_path, naming=naming)
    edit_tensors(ck, lambda t: t.pop(f"{UP}.{suffix}"))
    _fails(ck, "model.safetensors", f"{UP}.{suffix}", "missing")


def test_missing_dense_tensor(tmp_path):
    ck = fresh(tmp_path)
    edit_tensors(ck, lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    _fails(ck, "model.safetensors", "model.layers.1.linear_attn.A_log", "missing")


def test_wrong_dtype(tmp_path):
    ck = fresh(tmp_path)
    edit_tensors(ck, lambda t: t.update({f"{UP}.weight_scale": t[f"{UP}.weight_scale"].view(torch.uint8)}))
    _fails(ck, "model.safetensors", f"{UP}.weight_scale", "U8", "F8_E4M3")


def test_wrong_dense_dtype(tmp_path):
    ck = fresh(tmp_path)
    edit_tensors(ck, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int16)}))
    _fails(ck, "model.safetensors", "model.norm.weight", "I16", "BF16")


def test_wrong_shape(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors")
    edit_tensors(ck, lambda t: t.update({f"{UP}.weight_packed": t[f"{UP}.weight_packed"][:-1].clone()}))
    _fails(ck, "model.safetensors", f"{UP}.weight_packed", "[255, 64]", "[256, 64]")


def test_k_not_a_multiple_of_16(tmp_path):
    ck = fresh(tmp_path)
    edit_json(ck / "config.json", lambda c: c.update(intermediate_size=264))
    _fails(ck, "model.layers.0.mlp.down_proj", "K = 264", "multiple of 16")


def test_truncated_safetensors(tmp_path):
    ck = fresh(tmp_path)
    f = ck / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    _fails(ck, str(f), "safetensors")


def test_corrupt_safetensors_header(tmp_path):
    ck = fresh(tmp_path)
    f = ck / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:40] = b"#" * 32  # the JSON header is no longer JSON
    f.write_bytes(bytes(data))
    _fails(ck, str(f), "safetensors")


def test_shard_missing_from_index(tmp_path):
    ck = fresh(tmp_path, max_shard_bytes=200_000)
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (ck / shard).unlink()
    _fails(ck, shard, "model.safetensors.index.json", "does not exist")


def test_index_maps_tensor_to_a_shard_without_it(tmp_path):
    ck = fresh(tmp_path, max_shard_bytes=200_000)
    shards = sorted(set(json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"].values()))
    edit_json(ck / "model.safetensors.index.json", lambda c: c["weight_map"].update({"model.norm.weight": shards[0]}))
    _fails(ck, "model.norm.weight", shards[0])


@pytest.mark.parametrize("bad,what", [(0x7F, "NaN"), (0xB8, "negative")])  # E4M3 NaN; -1.0
def test_bad_block_scales(tmp_path, bad, what):
    ck = fresh(tmp_path)

    def poison(t):
        s = t[f"{UP}.weight_scale"].view(torch.uint8).clone()
        s[3, 2] = bad
        t[f"{UP}.weight_scale"] = s.view(torch.float8_e4m3fn)
    edit_tensors(ck, poison)
    _fails(ck, "model.safetensors", f"{UP}.weight_scale", what, "[3, 2]")


@pytest.mark.parametrize("naming,name,value", [
    ("modelopt", "weight_scale_2", 0.0), ("modelopt", "weight_scale_2", float("inf")),
    ("modelopt", "weight_scale_2", float("nan")), ("compressed-tensors", "weight_global_scale", 0.0),
    ("compressed-tensors", "weight_global_scale", float("inf")), ("modelopt", "input_scale", -1.0)])
def test_bad_global_scale(tmp_path, naming, name, value):
    ck = fresh(tmp_path, naming=naming)
    edit_tensors(ck, lambda t: t[f"{UP}.{name}"].fill_(value))
    _fails(ck, "model.safetensors", f"{UP}.{name}", "finite")


def test_nvfp4_module_stored_as_bf16(tmp_path):
    ck = fresh(tmp_path)
    edit_tensors(ck, lambda t: module_to_bf16(t, UP, "modelopt"))
    _fails(ck, "model.safetensors", f"{UP}.weight", "BF16", "NVFP4", "U8")


def test_excluded_module_carrying_nvfp4_tensors(tmp_path):
    ck = fresh(tmp_path, head="bf16")
    edit_json(ck / "hf_quant_config.json", lambda c: c["quantization"]["exclude_modules"].append("*.up_proj"))
    _fails(ck, "model.safetensors", UP, "BF16", "'*.up_proj'")


def test_head_excluded_but_quantized(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors", head="nvfp4")
    edit_json(ck / "config.json", lambda c: c["quantization_config"]["ignore"].append("lm_head"))
    _fails(ck, "lm_head", "BF16", "'lm_head'")


def test_tensors_of_the_other_naming(tmp_path):
    ck = fresh(tmp_path, naming="modelopt")
    edit_tensors(ck, lambda t: t.update({f"{UP}.weight_packed": t.pop(f"{UP}.weight")}))
    _fails(ck, UP, "weight_packed", "another naming")


def test_untied_head_missing(tmp_path):
    ck = fresh(tmp_path, head="bf16")
    edit_tensors(ck, lambda t: t.pop("lm_head.weight"))
    _fails(ck, "model.safetensors", "lm_head.weight", "tie_word_embeddings")


def test_no_safetensors_at_all(tmp_path):
    ck = fresh(tmp_path)
    (ck / "model.safetensors").unlink()
    _fails(ck, str(ck), "model.safetensors")


# ---- issue 27: malformed configs, non-regular files, non-finite tensors --------------------------

def test_config_json_a_list(tmp_path):
    ck = fresh(tmp_path)
    (ck / "config.json").write_text("[1, 2]")
    _fails(ck, str(ck / "config.json"), "expected a JSON object", "list")


def test_config_json_nested_too_deep(tmp_path):
    ck = fresh(tmp_path)
    (ck / "config.json").write_text("[" * 100_000)
    _fails(ck, str(ck / "config.json"), "cannot read JSON")


def test_text_config_a_string(tmp_path):
    ck = fresh(tmp_path)
    edit_json(ck / "config.json", lambda c: c.update(text_config="qwen3_5_text"))
    _fails(ck, "config.json", "text_config", "expected a JSON object", "str")


def test_quantization_config_a_string(tmp_path):
    ck = fresh(tmp_path, naming="compressed-tensors")
    edit_json(ck / "config.json", lambda c: c.update(quantization_config="nvfp4"))
    _fails(ck, "config.json", "quantization_config", "expected a JSON object", "str")


def test_quantized_layers_entry_a_string(tmp_path):
    ck = fresh(tmp_path, head="nvfp4")
    edit_json(ck / "hf_quant_config.json",
              lambda c: c["quantization"]["quantized_layers"].update({UP: "NVFP4"}))
    _fails(ck, "hf_quant_config.json", f"quantized_layers[{UP!r}]", "expected a JSON object", "str")


def test_exclude_modules_a_string(tmp_path):
    ck = fresh(tmp_path, head="bf16")
    edit_json(ck / "hf_quant_config.json", lambda c: c["quantization"].update(exclude_modules="lm_head"))
    _fails(ck, "hf_quant_config.json", "exclude_modules", "expected a list of strings", "'lm_head'")


@pytest.mark.parametrize("naming", ["modelopt", "compressed-tensors"])
def test_exclude_pattern_an_invalid_regex(tmp_path, naming):
    ck = fresh(tmp_path, naming=naming, head="bf16")
    if naming == "modelopt":
        edit_json(ck / "hf_quant_config.json", lambda c: c["quantization"]["exclude_modules"].append("re:("))
        file, key = "hf_quant_config.json", "exclude_modules"
    else:
        edit_json(ck / "config.json", lambda c: c["quantization_config"]["ignore"].append("re:("))
        file, key = "config.json", "ignore"
    _fails(ck, file, key, "'re:('", "regular expression")


def test_index_weight_map_value_not_a_file_name(tmp_path):
    ck = fresh(tmp_path, max_shard_bytes=200_000)
    edit_json(ck / "model.safetensors.index.json", lambda c: c["weight_map"].update({"model.norm.weight": 7}))
    _fails(ck, "model.safetensors.index.json", "model.norm.weight", "7")


@pytest.mark.parametrize("name,shards", [("hf_quant_config.json", False), ("config.json", False),
                                         ("model.safetensors", False), ("model.safetensors.index.json", True)])
def test_only_regular_files_are_opened(tmp_path, name, shards):
    """A FIFO in place of a checkpoint file is refused at once, never opened (opening one blocks)."""
    ck = fresh(tmp_path, max_shard_bytes=200_000) if shards else fresh(tmp_path)
    fifo = ck / name
    fifo.unlink()
    os.mkfifo(fifo)
    result = {}

    def load():
        try:
            load_checkpoint(ck)
        except BaseException as e:  # noqa: BLE001 - the test inspects whatever the loader raised
            result["error"] = e
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(20)
    hung = worker.is_alive()
    if hung:  # release the blocked open (a writer that closes at once: the reader sees EOF)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(20)
    assert not hung, f"loading a checkpoint whose {name} is a FIFO blocked"
    assert isinstance(result.get("error"), CheckpointError), result
    msg = str(result["error"])
    assert str(fifo) in msg and "FIFO" in msg and "regular file" in msg, msg


@pytest.mark.parametrize("name,dtype,value", [("model.norm.weight", torch.bfloat16, float("nan")),
                                              ("model.layers.1.linear_attn.A_log", torch.float32, float("inf")),
                                              ("model.embed_tokens.weight", torch.float16, float("-inf"))])
def test_non_finite_dense_tensor(tmp_path, name, dtype, value):
    ck = fresh(tmp_path)

    def poison(t):
        w = t[name].to(dtype)
        w.view(-1)[-1] = value
        t[name] = w
    edit_tensors(ck, poison)
    _fails(ck, "model.safetensors", repr(name), "NaN/Inf", "expected finite values")


def test_non_finite_extra_tensor(tmp_path):
    """A tensor the layout does not know rides along, but not with a NaN in it."""
    ck = fresh(tmp_path)
    edit_tensors(ck, lambda t: t.update({"model.mtp.norm.weight": torch.tensor([1.0, float("nan")])}))
    _fails(ck, "model.safetensors", "'model.mtp.norm.weight'", "NaN/Inf")
