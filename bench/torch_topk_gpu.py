"""torch.topk on CUDA, the reference of issue 13's GPU top-k goal.

    python3 bench/torch_topk_gpu.py [--floats 100000000] [--ratio 0.01] [--iters 20] [--json FILE]

Times torch.topk(x.abs(), k) (values and indices, the same work as
gradcomm's top-k by magnitude) on the same normal data size with CUDA
events; prints the median in ms. Exits 77 when torch has no usable CUDA.
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--floats", type=int, default=100_000_000)
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_topk_gpu: torch is not installed; nothing measured", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("torch_topk_gpu: torch has no usable CUDA; nothing measured", file=sys.stderr)
        return 77
    k = max(1, int(a.ratio * a.floats))
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(a.floats, device="cuda", generator=g)
    torch.topk(x.abs(), k)  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.topk(x.abs(), k)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    ms = times[len(times) // 2]
    name = torch.cuda.get_device_name(0)
    print(f"# {name}, {a.floats} floats, k {k}: torch.topk(x.abs(), k) median {ms:.3f} ms ({torch.__version__})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": [{"kernel": "torch.topk", "floats": a.floats, "k": k, "ms": ms, "device": name,
                                    "torch": torch.__version__}]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
