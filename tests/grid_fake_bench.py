"""A stand-in for `engine bench` in the grid runner's tests (run as a script, one process per arm).

Rates come from env REGATE_FAKE_BENCH_RATES, JSON {"<lm_head>" or "<lm_head>@b<batch>": [tok/s per call]};
the n-th call for a key gets the n-th rate (the last one repeats). Every call appends
{"lm_head", "batch", "pid", "argv"} to the JSON-lines file REGATE_FAKE_BENCH_LOG, which also counts calls.
REGATE_FAKE_BENCH_FAIL="<lm_head>:<call>" makes that call exit 3 with a message on stderr;
REGATE_FAKE_BENCH_GARBAGE=1 prints no JSON line.
"""
import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    for opt in ("--model", "--backend", "--lm-head", "--batch", "--prompt-len", "--gen-len",
                "--iters", "--warmup"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    log = os.environ["REGATE_FAKE_BENCH_LOG"]
    rates = json.loads(os.environ["REGATE_FAKE_BENCH_RATES"])
    key = f"{args.lm_head}@b{args.batch}" if f"{args.lm_head}@b{args.batch}" in rates else args.lm_head
    calls = 0
    if os.path.exists(log):
        with open(log) as f:
            calls = sum(1 for line in f if json.loads(line)["key"] == key)
    with open(log, "a") as f:
        f.write(json.dumps({"key": key, "lm_head": args.lm_head, "batch": int(args.batch),
                            "pid": os.getpid(), "argv": sys.argv[1:]}) + "\n")
    if os.environ.get("REGATE_FAKE_BENCH_FAIL") == f"{args.lm_head}:{calls}":
        print("CUDA error: an illegal memory access was encountered", file=sys.stderr)
        return 3
    if os.environ.get("REGATE_FAKE_BENCH_GARBAGE"):
        print("decode 12.3 tok/s (no JSON today)")
        return 0
    rate = rates[key][min(calls, len(rates[key]) - 1)]
    print(f"{'arm':>8} {'tok/s':>8}\n{args.lm_head:>8} {rate:8.3f}")
    print(json.dumps({"schema_version": 1, "decode_tok_s": rate, "decode_tok_s_iters": [rate] * int(args.iters),
                      "ms_per_step": 1000.0 / rate, "prefill_ms": 1.0, "peak_rss_bytes": 1,
                      "peak_device_bytes": 0, "meta": {"fake": True, "call": calls}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
