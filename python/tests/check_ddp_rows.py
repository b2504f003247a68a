"""Checks the JSON of bench/torch_ddp.py with every mode (the netns.torch_ddp
test): one row per mode, the names the issue fixes, and equal final losses
for the exact modes (same model, data and start). Exits non-zero naming
what is wrong.

usage: check_ddp_rows.py FILE
"""
import json
import sys


def main(path):
    rows = json.load(open(path))["results"]
    got = sorted((r["backend"], r["mode"]) for r in rows)
    want = sorted([("gloo", "ddp"), ("gradcomm", "ddp"), ("gradcomm", "ddp+fp16"), ("gradcomm", "ddp+topk"),
                   ("gradcomm", "reducer")])
    if got != want:
        sys.exit(f"{path}: rows {got}, expected {want}")
    for r in rows:
        for key in ("step_ms", "utilization", "final_loss"):
            if not isinstance(r.get(key), (int, float)):
                sys.exit(f"{path}: row {r} has no number '{key}'")
        if not (r["step_ms"] > 0 and 0 < r["utilization"] <= 1):
            sys.exit(f"{path}: row {r}: step_ms must be > 0 and utilization in (0, 1]")
    exact = {r["final_loss"] for r in rows if r["mode"] in ("ddp", "reducer")}
    if len(exact) != 1:
        sys.exit(f"{path}: the exact modes (ddp on gloo and gradcomm, reducer) end with different losses: {rows}")
    print(f"{path}: {len(rows)} rows ok")


if __name__ == "__main__":
    main(sys.argv[1])
