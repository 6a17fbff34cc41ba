"""The backend registry: a backend WITH an fp4 GEMM runs every NVFP4 Linear through it (a fake
GEMM registered on the CPU stands in for the CUDA kernel) and then no weight, not even the head,
keeps a dequantized operand."""
from __future__ import annotations

import pytest
import torch

from engine.backends import Fp4Gemm, fp4_gemm_for, fp4_gemm_status, register_fp4_gemm, unregister_fp4_gemm
from engine.engine import Engine
from engine.residency import iter_nvfp4_weights
from engine_oracle import tiny


class _RecordingGemm:
    """A reference fp4 GEMM (dequantize, FP32 matmul, BF16 out) that records what it is asked."""

    def __init__(self, operand_bytes: int = 0):
        self.prepared, self.calls, self.operand_bytes = [], [], operand_bytes

    def prepare(self, w):
        self.prepared.append(w.name)
        w.kernel_operand_bytes = self.operand_bytes or w.kernel_operand_bytes

    def matmul(self, x, w):
        assert x.dtype == torch.bfloat16 and x.dim() == 2
        self.calls.append(w.name)
        return (x.float() @ w.dequantize(torch.float32).t()).to(torch.bfloat16)


@pytest.fixture
def cpu_gemm():
    gemm = _RecordingGemm()
    register_fp4_gemm("cpu", Fp4Gemm(gemm.prepare, gemm.matmul))
    yield gemm
    unregister_fp4_gemm("cpu")


def test_cpu_has_no_fp4_gemm_by_default():
    assert fp4_gemm_for("cpu") is None
    assert fp4_gemm_status("cpu") == (False, "backend 'cpu' has no fp4 GEMM")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        fp4_gemm_for("tpu")


def test_a_registered_gemm_runs_every_nvfp4_linear_and_nothing_stays_dequantized(cpu_gemm):
    eng = Engine(tiny(), backend="cpu", lm_head="packed")
    names = sorted(w.name for w in iter_nvfp4_weights(eng.model))
    assert sorted(cpu_gemm.prepared) == names and "lm_head" in names  # prepared once each, at load
    for w in iter_nvfp4_weights(eng.model):
        assert not w.keep_dequant_b and w.dequant_b is None, w.name
    out = eng.generate([[3, 1, 4, 1, 5]], 3)
    assert set(cpu_gemm.calls) == set(names)
    assert len(out[0]) == 3
    unregister_fp4_gemm("cpu")  # the per-call dequant twin; the GEMM path only rounds activations to BF16
    ref = Engine(tiny(), backend="cpu", lm_head="packed").score([3, 1, 4, 1, 5])
    register_fp4_gemm("cpu", Fp4Gemm(cpu_gemm.prepare, cpu_gemm.matmul))
    got = eng.score([3, 1, 4, 1, 5])
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    rows = {r["name"]: r for r in eng.residency()["weights"]}
    assert rows["lm_head"]["read_bytes_per_step"] == rows["lm_head"]["packed_bytes"]


def test_a_gemm_may_not_keep_more_than_the_packed_bytes():
    gemm = _RecordingGemm(operand_bytes=10**9)
    register_fp4_gemm("cpu", Fp4Gemm(gemm.prepare, gemm.matmul))
    try:
        with pytest.raises(RuntimeError, match="more than the .* packed bytes"):
            Engine(tiny(), backend="cpu")
    finally:
        unregister_fp4_gemm("cpu")


def test_w4a4_is_opt_in_and_never_the_head():
    from engine.linear import Nvfp4Linear
    from engine.options import EngineOptions
    from engine.residency import iter_linears

    w4a16 = Engine(tiny())
    assert not [lin.name for lin in iter_linears(w4a16.model) if getattr(lin, "w4a4", False)]
    w4a4 = Engine(tiny(), options=EngineOptions(nvfp4_w4a4=True))
    nvfp4 = [lin for lin in iter_linears(w4a4.model) if isinstance(lin, Nvfp4Linear)]
    assert all(lin.w4a4 is (lin.role == "tower") for lin in nvfp4)
    assert any(lin.role == "head" for lin in nvfp4)
    a, b = w4a16.score([3, 1, 4, 1, 5]), w4a4.score([3, 1, 4, 1, 5])
    assert not torch.equal(a, b) and (a - b).abs().max() < 0.25 * a.abs().max()  # activations rounded to FP4


def test_a_policy_bound_gemm_is_one_object_per_backend_and_policy():
    """The cuda_engine suite checks `lin.gemm is fp4_gemm_for(backend)`: binding the kernel policy must
    not make a new GEMM per call. A GEMM whose calls take a policy gets it bound; a registration resets."""
    from kernels.policy import KernelPolicy

    seen = []
    g = Fp4Gemm(prepare=lambda w, policy: seen.append(policy), matmul=lambda x, w, policy: policy, takes_policy=True)
    register_fp4_gemm("cpu", g)
    try:
        a, b = fp4_gemm_for("cpu"), fp4_gemm_for("cpu", KernelPolicy())
        assert a is b and a is not g and a.matmul(0, 0) == KernelPolicy()
        other = fp4_gemm_for("cpu", KernelPolicy(split_waves=4))
        assert other is not a and other.matmul(0, 0).split_waves == 4
        register_fp4_gemm("cpu", g)
        assert fp4_gemm_for("cpu") is not a  # a new registration binds anew
    finally:
        unregister_fp4_gemm("cpu")
