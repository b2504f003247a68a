"""DDP training steps on Gloo and gradcomm, in one job.

    PYTHONPATH=build/python /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 \\
        --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
        bench/torch_ddp.py --steps 30 --json ddp.json

Modes: torch's DDP on a Gloo group ("ddp", backend gloo), torch's DDP on
the gradcomm world group ("ddp", gradcomm), DDP with gradcomm's fp16 hook
("ddp+fp16"), and gradcomm.torch.DistributedDataParallel ("reducer").
Every mode trains the same model from the same start on the same data.
JSON: {"results": [...]}, rows {backend, mode, step_ms (median), utilization, final_loss}, where
utilization = the step time of the model alone (no communication, same
rank) / step_ms.
"""
import argparse
import json
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--modes", default="ddp-gloo,ddp,ddp+fp16,reducer")
    p.add_argument("--json", help="write the rows here (rank 0)")
    args = p.parse_args()

    dist.init_process_group("gradcomm")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    local_ms, _ = run(make_model(args.width, args.depth), args.steps, args.warmup, args.batch, rank)
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
        elif mode == "reducer":
            backend, model = "gradcomm", gradcomm.torch.DistributedDataParallel(make_model(args.width, args.depth))
        else:
            raise SystemExit(f"unknown mode {mode}")
        step_ms, loss = run(model, args.steps, args.warmup, args.batch, rank)
        row = {"backend": backend, "mode": "ddp" if mode == "ddp-gloo" else mode, "step_ms": round(step_ms, 3),
               "utilization": round(min(1.0, local_ms / step_ms), 3), "final_loss": loss}
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        params = sum(p.numel() for p in make_model(args.width, args.depth).parameters())
        print(f"model: {params} parameters ({params * 4 / 2**20:.1f} MiB of gradients); "
              f"alone {local_ms:.2f} ms/step", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
