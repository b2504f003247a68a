"""A DDP training script switched to gradcomm: one import, one backend name.

Launch, after `pip install .` (or with PYTHONPATH=build/python and the
interpreter of scripts/bootstrap-python in a build tree):

    torchrun --nproc_per_node 2 examples/pytorch_ddp.py --steps 50 --hook fp16

Options: --backend gloo runs the same script on Gloo, for comparison;
--hook fp16|bf16|topk:0.01 compresses gradients inside the backend;
--mode gossip trains with gradcomm.torch.GossipDataParallel instead of DDP
(local gradients, then push-sum gossip of the parameters each step; the
exact average once at the end).
GRADCOMM_TIMELINE=trace.json writes trace.rankN.json (Chrome trace, open
in Perfetto); GRADCOMM_STATS=1 prints per-collective counters at the end.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomm.torch  # the only new line: registers backend "gradcomm"
from gradcomm.torch import hooks


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gradcomm", help="gradcomm or gloo")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--hook", default="none", help="none, fp16, bf16 or topk:RATIO (gradcomm only)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--mode", default="ddp", choices=["ddp", "gossip"],
                   help="ddp: gradients averaged in backward; gossip: GossipDataParallel (gradcomm only)")
    args = p.parse_args()
    if args.mode == "gossip" and (args.backend != "gradcomm" or args.hook != "none"):
        p.error("--mode gossip needs --backend gradcomm and no --hook")

    dist.init_process_group(args.backend)  # env:// from torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 1))
    model = gradcomm.torch.GossipDataParallel(net) if args.mode == "gossip" else DDP(net)
    if args.hook == "fp16":
        model.register_comm_hook(hooks.CompressionState(), hooks.fp16_hook)
    elif args.hook == "bf16":
        model.register_comm_hook(hooks.CompressionState(), hooks.bf16_hook)
    elif args.hook.startswith("topk:"):
        model.register_comm_hook(hooks.CompressionState(), hooks.topk_hook(float(args.hook.split(":", 1)[1])))
    elif args.hook != "none":
        p.error(f"unknown --hook {args.hook}")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of data
    w = torch.linspace(-1, 1, 64).unsqueeze(1)
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(128, 64, generator=g)
        y = torch.tanh(x @ w / 4)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # ddp: gradients are averaged over ranks here, bucket by bucket
        opt.step()
        if args.mode == "gossip":
            model.gossip_step()  # mix the parameters with this step's peer; never waits for it
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    if args.mode == "gossip":
        model.synchronize()  # the exact average (one allreduce of the parameters), e.g. before evaluation
        st = model.stats()
        print(f"rank {rank}: gossip sent {st['sent']}  mixed {st['received']}  late {st['late']}  "
              f"dropped {st['dropped']}", flush=True)
    if rank == 0:
        ms = (time.perf_counter() - start) * 1e3 / max(1, args.steps)
        print(f"backend {args.backend}  mode {args.mode}  hook {args.hook}  ranks {world}  {ms:.2f} ms/step",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
