"""The decode step's pick, kernel against torch: `python -m tools.tune.sample_bench [--batches 1,16]`.

kernels/sample.greedy_topk and its reference (`logits.topk(k)`, `logits.argmax()` and the four
writes of the sampled row, as engine/model_runner.py does them) on FP32 logits of the 27b
vocabulary (248320), both as CUDA-graph replays; each batch is first checked bit for bit (the
kernel's row against the reference's). Prints a table, then one JSON line. Tuning code: no product
module imports it.
"""
from __future__ import annotations

import argparse
import json

import torch

from kernels import sample
from tools.tune.bench import environment, median_ms

VOCAB = 248_320
TOP_K = 5


def reference(logits: torch.Tensor, k: int, out: torch.Tensor, prev: torch.Tensor) -> None:
    vals, top = logits.topk(k, dim=-1)
    greedy = logits.argmax(dim=-1)
    prev[:logits.shape[0]] = greedy
    out[:, 0] = greedy
    out[:, 1:1 + k] = vals
    out[:, 1 + k:] = top


def row(batch: int, vocab: int = VOCAB, k: int = TOP_K) -> dict:
    logits = torch.randn(batch, vocab, device="cuda") * 4
    outs = [torch.zeros(batch, 1 + 2 * k, dtype=torch.float64, device="cuda") for _ in range(2)]
    prevs = [torch.zeros(batch, dtype=torch.long, device="cuda") for _ in range(2)]
    reference(logits, k, outs[0], prevs[0])
    sample.greedy_topk(logits, k, outs[1], prevs[1])
    same = torch.equal(outs[0], outs[1]) and torch.equal(prevs[0], prevs[1])
    if not same:
        raise AssertionError(f"batch {batch}: the kernel's pick differs from torch's")
    t_ref = median_ms(lambda: reference(logits, k, outs[0], prevs[0]))
    t_kernel = median_ms(lambda: sample.greedy_topk(logits, k, outs[1], prevs[1]))
    return {"batch": batch, "vocab": vocab, "k": k, "torch_us": 1e3 * t_ref, "kernel_us": 1e3 * t_kernel,
            "ratio": t_ref / t_kernel, "bit_identical": same}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.tune.sample_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16")
    a = ap.parse_args(argv)
    rows = [row(int(b)) for b in a.batches.split(",")]
    print(f"{'batch':>5} {'torch us':>9} {'kernel us':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>5} {r['torch_us']:>9.2f} {r['kernel_us']:>9.2f} {r['ratio']:>6.2f}")
    print(json.dumps({"schema_version": 1, "bench": "sample", **environment(), "rows": rows}))


if __name__ == "__main__":
    main()
