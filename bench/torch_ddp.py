"""DDP training steps on Gloo and gradcomm, in one job.

    PYTHONPATH=build/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        bench/torch_ddp.py --steps 30 --json ddp.json

Modes: torch's DDP on a Gloo group ("ddp", backend gloo), torch's DDP on
the gradcomm world group ("ddp", gradcomm), DDP with gradcomm's fp16 hook
("ddp+fp16"), with its top-k hook ("ddp+topk", ratio --topk-ratio, 0.01),
and gradcomm.torch.DistributedDataParallel ("reducer").
Every mode trains the same model from the same start on the same data.
JSON: {"results": [...]}, rows {backend, mode, step_ms (median), utilization, final_loss}
(plus model_params, batch, compute_ms), where utilization = the step time
of the model alone (no communication, same rank) / step_ms.

--batch auto picks the batch whose compute takes --compute-ratio (2) times
the time a ring allreduce of all gradients needs on a link of --link-bps
(default: GRADCOMM_NETNS_RATE_BPS, set by scripts/netns-cluster): rank 0
times a few steps of the model alone at batches 16 and 64 and fits a fixed
plus a per-sample cost. On 2
emulated hosts at 1 Gbit/s (the issue's goals 2 and 3; scripts/torch-ddp-hosts
runs every mode in one job):

    scripts/torch-ddp-hosts --json ddp-hosts.json
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm.torch
from gradcomm.torch import hooks


def make_model(width, depth):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


def run(model, steps, warmup, batch, rank):
    g = torch.Generator().manual_seed(1 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.linspace(-1, 1, 256).unsqueeze(1)
    times, loss = [], float("nan")
    for step in range(warmup + steps):
        x = torch.randn(batch, 256, generator=g)
        y = torch.tanh(x @ w / 8)
        start = time.perf_counter()
        opt.zero_grad()
        out = torch.nn.functional.mse_loss(model(x), y)
        out.backward()
        opt.step()
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
        loss = out.item()
    return statistics.median(times), loss


def allreduce_seconds(params, world, link_bps):
    """A ring allreduce of `params` float32 gradients: each rank sends
    2 (world - 1) / world of the bytes over its link."""
    return params * 4 * 8 * 2 * (world - 1) / world / link_bps


def pick_batch(args, world, gloo):
    """The batch whose compute takes compute_ratio times the allreduce of
    every gradient; rank 0 decides, every rank uses it."""
    if args.batch != "auto":
        return int(args.batch)
    link_bps = args.link_bps or float(os.environ.get("GRADCOMM_NETNS_RATE_BPS", "0"))
    if link_bps <= 0:
        raise SystemExit("--batch auto needs --link-bps (or GRADCOMM_NETNS_RATE_BPS from scripts/netns-cluster)")
    model = make_model(args.width, args.depth)
    params = sum(p.numel() for p in model.parameters())
    target_ms = args.compute_ratio * allreduce_seconds(params, world, link_bps) * 1e3
    # A step costs a part that grows with the batch and one that does not
    # (weight gradients' accumulation, the optimizer): two probes fit both.
    small, large = 16, 64
    ms_small, _ = run(model, 3, 1, small, dist.get_rank())
    ms_large, _ = run(model, 3, 1, large, dist.get_rank())
    per_sample = max(1e-6, (ms_large - ms_small) / (large - small))
    fixed = max(0.0, ms_small - per_sample * small)
    batch = torch.tensor([max(1, round((target_ms - fixed) / per_sample))])
    if dist.get_rank() == 0:
        print(f"--batch auto: allreduce of {params} gradients at {link_bps / 1e9:g} Gbit/s "
              f"~{target_ms / args.compute_ratio:.0f} ms; compute {fixed:.0f} ms + {per_sample:.2f} ms/sample "
              f"-> batch {int(batch.item())} for {target_ms:.0f} ms", flush=True)
    dist.broadcast(batch, 0, group=gloo)
    return int(batch.item())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", default="32", help="samples per rank and step, or auto (see above)")
    p.add_argument("--compute-ratio", type=float, default=2.0, help="--batch auto: compute / allreduce time")
    p.add_argument("--link-bps", type=float, default=0, help="--batch auto: link rate, bits/s")
    p.add_argument("--topk-ratio", type=float, default=0.01, help="ratio of the ddp+topk mode")
    p.add_argument("--modes", default="ddp-gloo,ddp,ddp+fp16,ddp+topk,reducer")
    p.add_argument("--json", help="write the rows here (rank 0)")
    args = p.parse_args()

    dist.init_process_group("gradcomm")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    args.batch = pick_batch(args, dist.get_world_size(), gloo)
    local_ms, _ = run(make_model(args.width, args.depth), args.steps, args.warmup, args.batch, rank)
    params = sum(p.numel() for p in make_model(args.width, args.depth).parameters())
    rows = []
    for mode in args.modes.split(","):
        dist.barrier()
        if mode == "ddp-gloo":
            backend, model = "gloo", DDP(make_model(args.width, args.depth), process_group=gloo)
        elif mode == "ddp":
            backend, model = "gradcomm", DDP(make_model(args.width, args.depth))
        elif mode == "ddp+fp16":
            backend, model = "gradcomm", DDP(make_model(args.width, args.depth))
            model.register_comm_hook(hooks.CompressionState(), hooks.fp16_hook)
        elif mode == "ddp+topk":
            backend, model = "gradcomm", DDP(make_model(args.width, args.depth))
            model.register_comm_hook(hooks.CompressionState(), hooks.topk_hook(args.topk_ratio))
        elif mode == "reducer":
            backend, model = "gradcomm", gradcomm.torch.DistributedDataParallel(make_model(args.width, args.depth))
        else:
            raise SystemExit(f"unknown mode {mode}")
        step_ms, loss = run(model, args.steps, args.warmup, args.batch, rank)
        row = {"backend": backend, "mode": "ddp" if mode == "ddp-gloo" else mode, "step_ms": round(step_ms, 3),
               "utilization": round(min(1.0, local_ms / step_ms), 3), "final_loss": loss,
               "model_params": params, "batch": args.batch, "compute_ms": round(local_ms, 3)}
        if mode == "ddp+topk":
            row["ratio"] = args.topk_ratio
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        print(f"model: {params} parameters ({params * 4 / 2**20:.1f} MiB of gradients), batch {args.batch}; "
              f"alone {local_ms:.2f} ms/step; gradcomm transport: {dist.group.WORLD.transport()}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
