"""A build marker proven, not printed: the packed GEMM's marker counts only once the harness has seen it work.

`engine build` is the head's code, so its `packed NVFP4 W4A16 GEMM: ENABLED` line is self-reported: a head
could print it without building anything. Before the harness records the marker as present, it runs its
own probe (`PROBE`, this module's code, not the head's) in the head's tree on the box's GPU: a weight of
random NVFP4 bytes through the head's `kernels.nvfp4_gemm.prepare`/`matmul`, compared against the probe's
own decode of those bytes (torch's float8_e4m3fn for the scales, the E2M1 table for the codes); and the
GEMM must have launched a kernel of a shared object built for this run (mapped in the probe's process,
outside the installed libraries), whose symbols name the kernel the profiler saw. A marker the probe
cannot prove (no GPU, the kernel unavailable, a wrong result, no compiled kernel ran) is missing: a
degraded build, refused before any gate.

What the probe cannot rule out, a head forging from inside its own process (its matmul calling the
compiled kernel and discarding it), is the threat model's (docs/SERVICE.md, "Security").
"""
from __future__ import annotations

import json
import secrets

from orchestrator.box.tree import Tree

GEMM_MARKER = "packed NVFP4 W4A16 GEMM: ENABLED"
PROBE_TIMEOUT_S = 600.0
TOLERANCE = 2e-2  # relative error of a BF16-output GEMM over K = 1024 against the float64 reference

PROBE = r'''
import json, os, sys
NONCE = os.environ.pop("REGATE_PROBE_NONCE", "")  # before any module of the head is imported
out = {"proven": False}
try:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit(print(json.dumps({"nonce": NONCE, "proven": False, "why": "no CUDA GPU on this box"})))
    try:  # the format's own package; a revision from before it (a compare's base) kept it in engine/
        from nvfp4 import Nvfp4Weight
    except ImportError:
        from engine.nvfp4 import Nvfp4Weight
    from kernels import nvfp4_gemm as gemm
    ok, why = gemm.available()
    if not ok:
        raise SystemExit(print(json.dumps({"nonce": NONCE, "proven": False, "why": f"the head's kernel is not available: {why}"})))
    E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    g = torch.Generator(device="cuda").manual_seed(1234)
    n, k, m, gs = 384, 1024, 4, 1.0 / 448.0
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    scale = (torch.rand(n, k // 16, device="cuda", generator=g) * 3 + 0.125).to(torch.float8_e4m3fn)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, k).long()
    w = E2M1.to("cuda")[codes] * scale.double().repeat_interleave(16, dim=1) * gs
    ref = x.double() @ w.T
    weight = Nvfp4Weight("probe", packed.clone(), scale.clone(), gs, "modelopt")
    gemm.prepare(weight)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y = gemm.matmul(x, weight)
        torch.cuda.synchronize()
    err = float((y.double() - ref).norm() / ref.norm())
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    installed = tuple(p for p in sys.path if p) + (sys.prefix, sys.base_prefix, "/usr/", "/lib", "/opt/")
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith(".so")
                     and not line.split()[-1].startswith(installed)})
    def ident(name):
        name = name.split("(")[0].split("<")[0].strip()
        return name.split()[-1].split("::")[-1] if name else ""
    built = []
    for so in mapped:
        data = open(so, "rb").read()
        built += [(so, nm) for nm in names if ident(nm) and ident(nm).encode() in data]
    out = {"error": err, "kernels": names[:8], "built_objects": mapped[:8],
           "ran": [f"{nm} ({so})" for so, nm in built][:4]}
    if err > TOLERANCE:
        out["why"] = f"the head's GEMM disagrees with the probe's decode of the same bytes: relative error {err:.3g}"
    elif not built:
        out["why"] = "no kernel of a shared object built for this run ran in the GEMM (kernels: " + ", ".join(names[:4]) + ")"
    else:
        out["proven"] = True
except SystemExit:
    raise
except BaseException as e:
    out["why"] = f"the probe failed in the head's tree: {type(e).__name__}: {e}"
print(json.dumps({"nonce": NONCE, **out}))
'''.replace("TOLERANCE", repr(TOLERANCE))


def needs_proof(marker: str) -> bool:
    return marker.startswith(GEMM_MARKER)


def prove(tree: Tree, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """The probe's verdict on the packed GEMM of `tree`'s build: `{"proven": bool, "why"?, ...}`."""
    nonce = secrets.token_hex(16)  # a verdict line printed by the head's own code does not carry it
    res = tree.run(tree.py("-c", PROBE), timeout_s, env={"REGATE_PROBE_NONCE": nonce})
    if res.timed_out:
        return {"proven": False, "why": f"the probe timed out after {timeout_s:.0f} s"}
    for line in reversed(res.output.splitlines()):
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if isinstance(verdict, dict) and verdict.get("nonce") == nonce:
            return {k: v for k, v in verdict.items() if k != "nonce"}
    return {"proven": False, "why": f"the probe printed no verdict of its own (exit {res.returncode}):\n{res.tail(8)}"}
