"""The residency section: per backend, the packed and resident dequantized bytes each arm holds per
weight class, and the delta between the arms, computed from the record's weight shapes.

Residency is a property of the weight (DESIGN, `Nvfp4Weight.keep_dequant_b`):
- tower: packed in both arms on every backend; a backend without an fp4 GEMM dequantizes a tower
  projection into a per-call temporary, which is never resident;
- lm_head (weight class `head`), `dequant` arm: one BF16 copy (2*N*K bytes); the packed bytes are
  dropped at load;
- lm_head, `packed` arm, backend with an fp4 GEMM: the packed bytes alone;
- lm_head, `packed` arm, backend without one: the packed bytes plus one resident BF16 operand.
So the packed lm_head saves the BF16 copy minus its own packed bytes on CUDA and costs its packed
bytes on plain CPU (the seed's table for the 27B lm_head: CUDA -1.70 GiB, plain CPU +0.67 GiB).
The measured residency in the record (one backend, one arm) is checked against this model.
"""
from __future__ import annotations

from orchestrator.record import Record
from orchestrator.report.errors import ReportError

# (backend, label, has an fp4 GEMM)
BACKENDS = (("cuda", "CUDA", True), ("cpu", "plain CPU", False))
ARMS = ("dequant", "packed")
CLASSES = ("head", "tower")


def packed_bytes(n: int, k: int) -> int:
    """Checkpoint bytes of an NVFP4 [N, K] weight: E2M1 nibbles + E4M3 block scales + FP32 global."""
    return n * k // 2 + n * k // 16 + 4


def bf16_bytes(n: int, k: int) -> int:
    return 2 * n * k


def resident(cls: str, n: int, k: int, arm: str, fp4_gemm: bool, fmt: str = "nvfp4") -> tuple[int, int]:
    """(packed, dequantized) bytes one weight keeps resident in `arm` on a backend.

    The head is modelled as the checkpoint's NVFP4 head in every arm (the dequant arm's reading shows
    it as BF16, which is the point); a BF16 tower weight (an excluded module) is BF16 in both arms.
    """
    if cls != "head":
        return (0, bf16_bytes(n, k)) if fmt == "bf16" else (packed_bytes(n, k), 0)
    packed = packed_bytes(n, k)
    if arm == "dequant":
        return 0, bf16_bytes(n, k)
    return (packed, 0) if fp4_gemm else (packed, bf16_bytes(n, k))


def measurements(record: Record) -> list[dict]:
    """The record's residency readings: `engine info` residency + backend and arm, one per arm."""
    items = record.residency or []
    for i, m in enumerate(items):
        found = m.get("weights") if isinstance(m, dict) else m
        if not isinstance(found, list):
            raise ReportError(f"run {record.run_id}: residency[{i}].weights: expected a list of "
                              f"weights, found {found!r:.80}")
    return items


def _weights_by_class(weights: list[dict]) -> dict[str, list[dict]]:
    by_class: dict[str, list[dict]] = {}
    for w in weights:
        for field in ("class", "n", "k"):
            if field not in w:
                raise ReportError(f"residency weight {w.get('name', '?')}: field {field!r} missing")
        by_class.setdefault(w["class"], []).append(w)
    return by_class


def _sum(ws: list[dict], arm: str, fp4_gemm: bool) -> dict:
    packed = dequant = 0
    for w in ws:
        p, d = resident(w["class"], int(w["n"]), int(w["k"]), arm, fp4_gemm, w.get("format", "nvfp4"))
        packed, dequant = packed + p, dequant + d
    return {"packed": packed, "dequant": dequant, "total": packed + dequant}


def model_rows(weights: list[dict]) -> list[dict]:
    """Per backend and weight class: each arm's resident bytes and the delta packed - dequant."""
    rows = []
    by_class = _weights_by_class(weights)
    for backend, label, fp4_gemm in BACKENDS:
        for cls in [c for c in CLASSES if c in by_class] + sorted(set(by_class) - set(CLASSES)):
            ws = by_class[cls]
            arms = {arm: _sum(ws, arm, fp4_gemm) for arm in ARMS}
            shape = f"{ws[0]['n']} x {ws[0]['k']}" if len(ws) == 1 else f"{len(ws)} weights"
            rows.append({"backend": backend, "label": label, "class": cls, "shape": shape, "arms": arms,
                         "delta": arms["packed"]["total"] - arms["dequant"]["total"]})
    return rows


def check(m: dict) -> list[dict]:
    """The measured reading per class against the model for its backend and arm."""
    backend, arm = m.get("backend"), m.get("arm")
    fp4_gemm = dict((b, g) for b, _, g in BACKENDS).get(backend)
    out = []
    for cls, ws in _weights_by_class(m["weights"]).items():
        measured = sum(int(w.get("dequant_bytes") or 0) for w in ws)
        row = {"backend": backend, "arm": arm, "class": cls, "measured_dequant": measured,
               "packed": sum(int(w.get("packed_bytes") or 0) for w in ws),
               "kernel_operand": sum(int(w.get("kernel_operand_bytes") or 0) for w in ws),
               "expected_dequant": None, "agrees": None}
        if fp4_gemm is not None and arm in ARMS:
            row["expected_dequant"] = _sum(ws, arm, fp4_gemm)["dequant"]
            row["agrees"] = row["expected_dequant"] == measured
        out.append(row)
    return out


def section(record: Record) -> dict | None:
    """The residency section of a report, or None when the record carries no residency. Every model
    row is computed; each says whether this box measured its backend too, and whether that agreed."""
    ms = measurements(record)
    if not ms:
        return None
    measured = [r for m in ms for r in check(m)]
    rows = [{**r, "basis": basis(r["backend"], measured)} for r in model_rows(ms[0]["weights"])]
    return {"rows": rows, "measured": measured}


def basis(backend: str, measured: list[dict]) -> str:
    """How a computed row stands against this box's readings of its backend."""
    mine = [m for m in measured if m["backend"] == backend and m["agrees"] is not None]
    if not mine:
        return "computed; not measured on this box"
    if all(m["agrees"] for m in mine):
        return "computed; measured here, agrees"
    return "computed; measured here, DISAGREES"
