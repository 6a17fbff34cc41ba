"""A stand-in for `python -m tools.attribution --json` in the grid runner's tests (one process per arm).

Appends {"key": "attribute:<lm_head>", "lm_head", "pid", "argv"} to the JSON-lines file
REGATE_FAKE_BENCH_LOG (the fake bench's log, so the order of legs and attributions is one list).
REGATE_FAKE_ATTRIBUTE_FAIL="<lm_head>" makes that arm exit 2 with a message on stderr.
"""
import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    for opt in ("--model", "--backend", "--lm-head", "--lengths", "--batch", "--prompt-len", "--iters"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with open(os.environ["REGATE_FAKE_BENCH_LOG"], "a") as f:
        f.write(json.dumps({"key": f"attribute:{args.lm_head}", "lm_head": args.lm_head, "pid": os.getpid(),
                            "argv": sys.argv[1:]}) + "\n")
    if os.environ.get("REGATE_FAKE_ATTRIBUTE_FAIL") == args.lm_head:
        print("attribute: trace: a CUDA graph replay ran 3 device activities", file=sys.stderr)
        return 2
    head = 1.0 if args.lm_head == "packed" else 3.0
    parts = [{"name": "lm_head", "ms_per_step": head, "spread_ms": 0.01, "bytes_per_step": 100},
             {"name": "norm", "ms_per_step": 0.5, "spread_ms": 0.01}, {"name": "idle", "ms_per_step": 0.1,
                                                                       "spread_ms": 0.01}]
    total = sum(p["ms_per_step"] for p in parts)
    print(json.dumps({"schema_version": 1, "kind": "attribution", "arm": args.lm_head, "parts": parts,
                      "total_ms_per_step": total, "closure": 1.0, "profiler_overhead": 0.0,
                      "lengths": [int(x) for x in args.lengths.split(",")]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
