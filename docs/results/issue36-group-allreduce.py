# What a call costs on the default group, a subgroup of every rank, a separate
# communicator and Gloo (docs/PERFORMANCE.md, issue 36, goal 1):
#   PYTHONPATH=build/python $PY -m torch.distributed.run --nproc_per_node 2 \
#       --master_addr 127.0.0.1 --master_port 29514 docs/results/issue36-group-allreduce.py
import os, time, torch, torch.distributed as dist, gradcomm.torch
dist.init_process_group("gradcomm")
r, w = dist.get_rank(), dist.get_world_size()
os.environ["GRADCOMM_TORCH_GROUPS"] = "shared"
whole = dist.new_group(backend="gradcomm")                       # every rank: shares the shared memory
os.environ["GRADCOMM_TORCH_GROUPS"] = "separate"; sep = dist.new_group(backend="gradcomm")
gloo = dist.new_group(backend="gloo")
for n in (2, 1024, 16 << 20):
    t = torch.ones(n)
    res = {}
    for name, g in (("default", None), ("subgroup", whole), ("separate", sep), ("gloo", gloo)):
        iters = 2000 if n < 1e6 else 10
        for _ in range(5): dist.all_reduce(t, group=g)
        times = []
        for rep in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters): dist.all_reduce(t, group=g)
            times.append((time.perf_counter() - t0) / iters * 1e6)
        res[name] = sorted(times)[2]
    if r == 0: print(n * 4, "bytes, us per call (median of 5 blocks):", {k: round(v, 1) for k, v in res.items()}, flush=True)
dist.destroy_process_group()
