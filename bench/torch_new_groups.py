"""What `dist.new_group` costs on gradcomm and on Gloo, in one job.

    PYTHONPATH=build/python $PY -m torch.distributed.run \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        bench/torch_new_groups.py --groups 200 --json groups.json

The default group is gradcomm's. Each kind makes --groups groups of all the
ranks back to back, then runs one all_reduce on each (so each is usable and
formed): the time per group (the slowest rank's), and the growth of the
process's threads, open descriptors and resident memory per group (rank 0).
Kinds: gradcomm's default (subgroups of the default group), gradcomm with
GRADCOMM_TORCH_GROUPS=separate (a communicator each; --separate-groups of
them, fewer: each holds a whole stack), and Gloo.
JSON: {"results": [{kind, groups, ms_per_group, threads, fds, rss_kib_per_group}]}.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import gradcomm.torch  # noqa: F401


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def measure(kind, count, world):
    backend = "gloo" if kind == "gloo" else "gradcomm"
    os.environ["GRADCOMM_TORCH_GROUPS"] = "separate" if kind == "gradcomm-separate" else "shared"
    dist.barrier()
    threads, fds, rss = status("Threads"), len(os.listdir("/proc/self/fd")), status("VmRSS")
    t0 = time.perf_counter()
    groups = [dist.new_group(backend=backend) for _ in range(count)]
    for g in groups:
        dist.all_reduce(torch.ones(1), group=g)
    mine = (time.perf_counter() - t0) * 1e3 / count
    slowest = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    row = {"kind": kind, "groups": count, "ms_per_group": slowest.item(),
           "threads": [threads, status("Threads")], "fds": [fds, len(os.listdir("/proc/self/fd"))],
           "rss_kib_per_group": (status("VmRSS") - rss) / count, "world": world}
    return row, groups


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--separate-groups", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    dist.init_process_group("gradcomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(1))
    rows, keep = [], []
    for kind, count in (("gloo", a.groups), ("gradcomm", a.groups), ("gradcomm-separate", a.separate_groups)):
        row, groups = measure(kind, count, world)
        rows.append(row)
        keep.append(groups)  # alive until the end, as a framework's groups are
        if rank == 0:
            print(f"{kind:>18}: {count} groups, {row['ms_per_group']:.3f} ms each; threads {row['threads'][0]} -> "
                  f"{row['threads'][1]}, descriptors {row['fds'][0]} -> {row['fds'][1]}, resident "
                  f"{row['rss_kib_per_group']:+.1f} KiB per group", flush=True)
    if rank == 0:
        g = {r["kind"]: r for r in rows}
        print(f"gradcomm / gloo time per group: {g['gradcomm']['ms_per_group'] / g['gloo']['ms_per_group']:.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
