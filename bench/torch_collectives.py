"""torch.distributed collectives on Gloo and gradcomm, in one job.

    PYTHONPATH=build/python $PY -m torch.distributed.run \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        bench/torch_collectives.py --max-bytes 16M --json coll.json

Each size is timed as nccl-tests does: after a barrier, a block of calls
back to back, the time per call; `--reps` blocks, the median block kept.
(Timing single calls after a barrier measures the ranks' skew leaving the
barrier, tens to hundreds of microseconds on a loaded host, not the call.)
The sizes run from --min-bytes by --factor, and --max-bytes itself is
always the last size.

JSON: {"results": [...]}, rows {backend, mode, bytes, time_us (median), busbw_gbps} with
nccl-tests' bus-bandwidth factors (allreduce 2(n-1)/n, allgather and
reduce_scatter (n-1)/n, broadcast 1). A mode the Gloo of this torch does not
have runs on gradcomm only. float32 tensors; `bytes` is the size of
the whole buffer (the output of allgather, the input of reduce_scatter).
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import gradcomm.torch  # noqa: F401


def parse_bytes(text):
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def one(mode, nbytes, group, world, rank):
    n = max(1, nbytes // 4)
    if mode == "allreduce":
        t = torch.ones(n)
        return lambda: dist.all_reduce(t, group=group), 2 * (world - 1) / world
    if mode == "broadcast":
        t = torch.ones(n)
        return lambda: dist.broadcast(t, src=0, group=group), 1.0
    per = max(1, n // world)
    if mode == "allgather":
        outs = [torch.empty(per) for _ in range(world)]
        t = torch.ones(per)
        return lambda: dist.all_gather(outs, t, group=group), (world - 1) / world
    if mode == "reduce_scatter":
        ins = [torch.ones(per) for _ in range(world)]
        out = torch.empty(per)
        return lambda: dist.reduce_scatter(out, ins, group=group), (world - 1) / world
    raise SystemExit(f"unknown mode {mode}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="16M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20, help="calls per timed block (fewer above 1 MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed blocks per size; the median is kept")
    p.add_argument("--modes", default="allreduce,allgather,broadcast,reduce_scatter")
    p.add_argument("--json")
    args = p.parse_args()

    dist.init_process_group("gradcomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.new_group(backend="gloo"), "gradcomm": None}
    rows = []
    sizes, size, top = [], parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    while size < top:
        sizes.append(size)
        size *= args.factor
    sizes.append(top)
    for size in sizes:
        for mode in args.modes.split(","):
            for backend, group in groups.items():
                call, factor = one(mode, size, group, world, rank)
                try:
                    call()  # warm up
                except RuntimeError as e:
                    if backend == "gloo" and "does not support" in str(e):
                        continue
                    raise
                calls = max(2, min(args.iters, args.iters * 2**20 // size)) if size > 2**20 else args.iters
                times = []
                for _ in range(args.reps):
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    for _ in range(calls):
                        call()
                    times.append((time.perf_counter() - start) * 1e6 / calls)
                us = statistics.median(times)
                row = {"backend": backend, "mode": mode, "bytes": size, "time_us": round(us, 1),
                       "busbw_gbps": round(size * factor / us / 1e3, 3)}
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"results": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
