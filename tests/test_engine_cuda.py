"""The CUDA backend: decode captured in CUDA graphs must equal eager decode, the arms must agree,
and the fp4 GEMM (when the kernel is available) must be what the NVFP4 Linears dispatch to.
Skipped without a GPU; the lead runs these on the device."""
from __future__ import annotations

import pytest
import torch

from engine.backends import fp4_gemm_status
from engine.engine import Engine
from engine.residency import iter_nvfp4_weights
from engine_oracle import tiny

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
PROMPTS = [[5, 17, 400, 3, 3, 91, 250], [42, 7], [1, 2, 3]]


@pytest.mark.parametrize("arm", ["packed", "dequant"])
def test_graph_decode_equals_eager_decode(arm):
    graphs = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64)
    eager = Engine(tiny(), backend="cuda", lm_head=arm, max_num_seqs=4, max_model_len=64, cuda_graphs=False)
    assert sorted(graphs.runner().graphs) == [1, 2, 4] and not eager.runner().graphs
    assert graphs.generate(PROMPTS, 6) == eager.generate(PROMPTS, 6)  # batch 3 pads to bucket 4
    for a, b in zip(graphs.last_topk, eager.last_topk):
        assert [t.ids for t in a] == [t.ids for t in b]
        torch.testing.assert_close(torch.tensor([t.logits for t in a]), torch.tensor([t.logits for t in b]))


def test_cuda_arms_agree_and_only_the_head_is_special():
    packed = Engine(tiny(), backend="cuda", lm_head="packed", max_num_seqs=4, max_model_len=64)
    dequant = Engine(tiny(), backend="cuda", lm_head="dequant", max_num_seqs=4, max_model_len=64)
    assert packed.generate(PROMPTS, 6) == dequant.generate(PROMPTS, 6)
    has_gemm, _ = fp4_gemm_status("cuda")
    for w in iter_nvfp4_weights(packed.model):
        assert w.dequant_b is None or (w.name == "lm_head" and not has_gemm), w.name
        assert w.checkpoint_layout_resident is (w.kernel_operand is None), w.name  # packed bytes held once
        assert w.keep_dequant_b is (w.name == "lm_head" and not has_gemm), w.name


def test_cuda_close_to_cpu():
    cpu = Engine(tiny()).score(PROMPTS[0])
    gpu = Engine(tiny(), backend="cuda", max_num_seqs=2, max_model_len=64).score(PROMPTS[0]).cpu()
    assert (cpu - gpu).abs().max() < 0.05 * cpu.abs().max()  # BF16 activations against FP32


def test_a_packed_bench_without_the_kernel_is_refused(tmp_path):
    """The kernel disabled (the option fp4_gemm=0): the packed arm on CUDA would run its head on a BF16
    operand, so `engine bench` exits 2 and prints no JSON number; the dequant arm still measures."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    base = [sys.executable, "-m", "engine.cli", "bench", "--model", str(tiny()), "--backend", "cuda",
            "--gen-len", "4", "--iters", "1", "--warmup", "0", "--json", "--option", "fp4_gemm=0"]
    packed = subprocess.run(base + ["--lm-head", "packed"], env=env, capture_output=True, text=True, timeout=300)
    assert packed.returncode == 2 and "no number is reported" in packed.stderr, packed.stderr[-2000:]
    assert not [ln for ln in packed.stdout.splitlines() if ln.startswith("{")]
    dequant = subprocess.run(base + ["--lm-head", "dequant"], env=env, capture_output=True, text=True, timeout=300)
    assert dequant.returncode == 0, dequant.stderr[-2000:]
    params = json.loads(dequant.stdout.splitlines()[-1])["params"]
    assert params["fp4_gemm"] is False and params["head_fp4_gemm"] is False
