"""One rank of a multi-process test job (see harness.py).

usage: workers.py SCENARIO RANK WORLD INIT_METHOD OUTDIR [ARGS...]

Each scenario raises AssertionError when a check fails; the process then
exits non-zero and the test prints its output.
"""
import contextlib
import gc
import weakref
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import gradcomm.torch  # noqa: F401  registers the backend

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX}
if hasattr(R, "AVG"):
    OPS["AVG"] = R.AVG
# Gloo (1.13) has no bfloat16, no bool, no AVG: the reference is built from
# what Gloo has (float32 for bfloat16, uint8 for bool, SUM then divide).
GLOO_TYPES = {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int32, torch.int64}


def result(obj):
    print("RESULT " + json.dumps(obj), flush=True)


def init(rank, world, init_method, timeout_s=60, backend="gradcomm"):
    """init_process_group; env:// (torchrun) takes rank and world from the
    environment. Returns (rank, world)."""
    if init_method == "env://":
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def values(dtype, rank, n, seed, small=False):
    """Deterministic integer-valued data, so sums and products are exact in
    every dtype whatever the order of reduction."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    lo, hi = (-3, 4) if small else (-8, 9)
    if dtype == torch.uint8:
        lo, hi = 0, (4 if small else 9)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def noncontiguous(t):
    """A non-contiguous tensor with t's values (every other element of a
    twice-as-long buffer)."""
    big = torch.zeros(t.numel() * 2, dtype=t.dtype)
    v = big[::2]
    v.copy_(t)
    assert not v.is_contiguous()
    return v


def layouts(t):
    yield "contiguous", t.clone()
    yield "strided", noncontiguous(t)


def close(name, got, want):
    try:
        if got.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            torch.testing.assert_close(got, want, check_dtype=True, equal_nan=True)
        else:
            assert torch.equal(got, want), f"values differ:\n got  {got}\n want {want}"
    except AssertionError as e:
        raise AssertionError(f"{name}: {e}") from None


def gloo_allreduce(gloo, t, op_name):
    """Gloo's allreduce of t, widened where Gloo lacks the dtype or op."""
    world = dist.get_world_size(gloo)
    if t.dtype == torch.bool:
        x = t.to(torch.uint8)
        op = R.MAX if op_name in ("SUM", "MAX") else R.MIN
        dist.all_reduce(x, op=op, group=gloo)
        return x.bool()
    x = t.float() if t.dtype == torch.bfloat16 else t.clone()
    if op_name == "AVG":
        dist.all_reduce(x, op=R.SUM, group=gloo)
        x = x / world
    else:
        dist.all_reduce(x, op=OPS[op_name], group=gloo)
    return x.to(t.dtype)


def reducible(dtype, op_name):
    if op_name == "AVG":
        return dtype.is_floating_point
    return True


# ---- scenarios ------------------------------------------------------------------------

def scenario_collectives(rank, world, init_method, outdir):
    """Every collective x dtype x op x layout against Gloo in the same job."""
    init(rank, world, init_method)
    gloo = dist.new_group(backend="gloo")
    assert isinstance(gradcomm.torch.get_backend_group(), gradcomm.torch.ProcessGroupGradcomm)
    checked = 0
    n = 7  # odd, not divisible by 2 or 3
    for dtype in DTYPES:
        # allreduce (sync and async; the future holds the output)
        for op_name in OPS:
            if not reducible(dtype, op_name):
                continue
            small = op_name == "PRODUCT"
            x = values(dtype, rank, n, 1, small)
            want = gloo_allreduce(gloo, x, op_name)
            for layout, t in layouts(x):
                if (layout == "strided") == (checked % 2 == 0):
                    dist.all_reduce(t, op=OPS[op_name])
                else:
                    w = dist.all_reduce(t, op=OPS[op_name], async_op=True)
                    fut = w.get_future().wait()
                    assert isinstance(fut, list) and len(fut) == 1, fut
                    close("future of allreduce", fut[0], t)
                    assert w.is_completed()
                close(f"allreduce {dtype} {op_name} {layout}", t, want)
                checked += 1
            # reduce to the last rank
            root = world - 1
            for layout, t in layouts(x):
                dist.reduce(t, dst=root, op=OPS[op_name])
                if rank == root:
                    close(f"reduce {dtype} {op_name} {layout}", t, want)
                checked += 1
            # reduce_scatter and _reduce_scatter_base: Gloo 1.13 has neither;
            # the reference is Gloo's allreduce of the whole input, sliced.
            full = values(dtype, rank, n * world, 2, small)
            want_full = gloo_allreduce(gloo, full, op_name)
            want_part = want_full[rank * n:(rank + 1) * n]
            for layout, _ in layouts(x):
                out = torch.zeros(n, dtype=dtype) if layout == "contiguous" else noncontiguous(torch.zeros(n, dtype=dtype))
                parts = [p.clone() if layout == "contiguous" else noncontiguous(p) for p in full.split(n)]
                dist.reduce_scatter(out, parts, op=OPS[op_name])
                close(f"reduce_scatter {dtype} {op_name} {layout}", out, want_part)
                out2 = torch.zeros(n, dtype=dtype)
                dist._reduce_scatter_base(out2, full.clone(), op=OPS[op_name])
                close(f"_reduce_scatter_base {dtype} {op_name}", out2, want_part)
                checked += 2
        # allreduce_coalesced: several tensors, one collective
        for op_name in ("SUM", "MAX"):
            xs = [values(dtype, rank, k, 3 + k) for k in (1, 5, 4)]
            wants = [gloo_allreduce(gloo, x, op_name) for x in xs]
            ts = [xs[0].clone(), noncontiguous(xs[1]), xs[2].clone().view(2, 2)]
            dist.all_reduce_coalesced(ts, op=OPS[op_name])
            for i, (t, w) in enumerate(zip(ts, wants)):
                close(f"allreduce_coalesced {dtype} {op_name} [{i}]", t.reshape(-1), w)
            checked += 1
        # The data-moving collectives; Gloo moves bfloat16 and bool as bytes
        # of another dtype of the same size.
        def as_gloo(t):
            if dtype == torch.bfloat16:
                return t.view(torch.float16)  # same size; Gloo only moves the bytes
            if dtype == torch.bool:
                return t.view(torch.uint8)
            return t
        x = values(dtype, rank, n, 4)
        # broadcast from every root
        for root in range(world):
            ref = x.clone()
            dist.broadcast(as_gloo(ref), src=root, group=gloo)
            for layout, t in layouts(x):
                dist.broadcast(t, src=root)
                close(f"broadcast {dtype} root {root} {layout}", t, ref)
                checked += 1
        # allgather and _allgather_base
        refs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
        dist.all_gather([as_gloo(r) for r in refs], as_gloo(x), group=gloo)
        for layout, t in layouts(x):
            outs = [torch.zeros(n, dtype=dtype) if layout == "contiguous" else noncontiguous(torch.zeros(n, dtype=dtype))
                    for _ in range(world)]
            w = dist.all_gather(outs, t, async_op=True)
            got = w.get_future().wait()
            assert len(got) == world
            for i in range(world):
                close(f"allgather {dtype} [{i}] {layout}", outs[i], refs[i])
                close(f"future of allgather {dtype} [{i}]", got[i], refs[i])
            checked += 1
        flat = torch.zeros(n * world, dtype=dtype)
        dist._all_gather_base(flat, x.clone())
        close(f"_allgather_base {dtype}", flat, torch.cat(refs))
        checked += 1
        # gather and scatter to/from every root
        for root in range(world):
            ref = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
            dist.gather(as_gloo(x), [as_gloo(r) for r in ref] if ref else None, dst=root, group=gloo)
            got = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
            dist.gather(noncontiguous(x), got, dst=root)
            if rank == root:
                for i in range(world):
                    close(f"gather {dtype} root {root} [{i}]", got[i], ref[i])
            parts = [values(dtype, i, n, 5 + root) for i in range(world)] if rank == root else None
            ref_out = torch.zeros(n, dtype=dtype)
            dist.scatter(as_gloo(ref_out), [as_gloo(p) for p in parts] if parts else None, src=root, group=gloo)
            out = noncontiguous(torch.zeros(n, dtype=dtype))
            dist.scatter(out, parts, src=root)
            close(f"scatter {dtype} root {root}", out, ref_out)
            checked += 2
        # all_to_all_single: equal and uneven splits (rows of 3 elements)
        rows = values(dtype, rank, world * 2 * 3, 6).view(world * 2, 3)
        ref = torch.zeros_like(rows)
        dist.all_to_all_single(as_gloo(ref), as_gloo(rows), group=gloo)
        out = torch.zeros_like(rows)
        dist.all_to_all_single(out, rows)
        close(f"all_to_all_single {dtype} equal", out, ref)
        # rank r sends (r + j) % 3 + 0..2 rows to rank j
        in_splits = [(rank + j) % 3 for j in range(world)]
        out_splits = [(j + rank) % 3 for j in range(world)]
        src = values(dtype, rank, sum(in_splits) * 3, 7).view(-1, 3)
        ref = torch.zeros(sum(out_splits), 3, dtype=dtype)
        dist.all_to_all_single(as_gloo(ref), as_gloo(src), out_splits, in_splits, group=gloo)
        out = torch.zeros(sum(out_splits), 3, dtype=dtype)
        dist.all_to_all_single(out, src, out_splits, in_splits)
        close(f"all_to_all_single {dtype} uneven", out, ref)
        checked += 2
    # barrier, and empty tensors
    dist.barrier()
    e = torch.zeros(0)
    dist.all_reduce(e)
    dist.broadcast(e, src=0)
    dist.barrier()
    result({"checked": checked})
    dist.destroy_process_group()


def scenario_init(rank, world, init_method, outdir):
    """init_process_group through init_method (tcp://, file://, env://) with a timeout."""
    if init_method == "env://":
        dist.init_process_group("gradcomm", timeout=datetime.timedelta(seconds=42))
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        init(rank, world, init_method, timeout_s=42)
    assert dist.get_backend() == "gradcomm", dist.get_backend()
    pg = gradcomm.torch.get_backend_group()
    assert pg.timeout == datetime.timedelta(seconds=42), pg.timeout
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(world * (world + 1) // 2))), t
    result({"rank": rank, "world": world, "transport": pg.transport()})
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 1))


def _batches(rank, steps):
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        yield x, x.sum(dim=1, keepdim=True).sin()


def train(backend, rank, steps=20, hook=None, hook_state=None, lr=0.05, bucket_cap_mb=25):
    from torch.nn.parallel import DistributedDataParallel as DDP
    group = dist.new_group(backend=backend)
    model = DDP(_model(), process_group=group, bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        model.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in _batches(rank, steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def scenario_ddp(rank, world, init_method, outdir):
    """DDP for 20 steps: gradcomm and Gloo give the same parameters."""
    rank, world = init(rank, world, init_method)
    m_gc, l_gc = train("gradcomm", rank)
    m_gl, l_gl = train("gloo", rank)
    worst = 0.0
    for (name, a), b in zip(m_gc.module.named_parameters(), m_gl.module.parameters()):
        worst = max(worst, (a - b).abs().max().item())
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"parameter {name}: {m}")
    # and every rank ends with the same parameters
    flat = torch.cat([p.detach().reshape(-1) for p in m_gc.module.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=R.MIN)
    dist.all_reduce(hi, op=R.MAX)
    assert torch.equal(lo, hi), "ranks diverged"
    result({"rank": rank, "max_param_diff": worst, "loss_first": l_gc[0], "loss_last": l_gc[-1],
            "module": gradcomm.torch.__file__})
    dist.destroy_process_group()


def _target(x):
    """A smooth function the small model can learn."""
    w = torch.linspace(-1, 1, x.shape[1]).unsqueeze(1)
    return torch.tanh(x @ w / 2)


def _eval_loss(module):
    ge = torch.Generator().manual_seed(999)
    xe = torch.randn(256, 16, generator=ge)
    with torch.no_grad():
        return torch.nn.functional.mse_loss(module(xe), _target(xe)).item()


def _fit(rank, hook=None, steps=60, lr=0.1):
    """Full-batch regression on fixed per-rank data; returns the loss of the
    final model on a fixed evaluation set (the same on every rank)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gradcomm.torch import hooks
    model = DDP(_model(), bucket_cap_mb=0.004)  # a few buckets of ~1000 floats
    if hook is not None:
        model.register_comm_hook(hooks.CompressionState(), hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(64, 16, generator=g)
    y = _target(x)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return _eval_loss(model.module)


def scenario_hooks(rank, world, init_method, outdir):
    """fp16, bf16 and top-k hooks with error feedback converge like uncompressed training."""
    from gradcomm.torch import hooks
    init(rank, world, init_method)
    losses = {"initial": _eval_loss(_model()), "none": _fit(rank)}
    for name, hook in [("fp16", hooks.fp16_hook), ("bf16", hooks.bf16_hook), ("topk", hooks.topk_hook(0.1))]:
        losses[name] = _fit(rank, hook)
    stats = gradcomm.torch.stats()
    # the hooks ran in the backend, one collective per bucket
    for spec in ("allreduce[fp16:prescale]", "allreduce[bf16]", "allreduce[topk:0.1]"):
        assert stats.get(spec, {}).get("calls", 0) >= 60, (spec, stats)
    # one bucket by hand: fp16 keeps the average to fp16 precision
    pg = gradcomm.torch.get_backend_group()
    x = torch.randn(1000, generator=torch.Generator().manual_seed(rank)) * 3
    want = x.clone()
    dist.all_reduce(want)
    want /= world
    got = x.clone()
    fut = pg.allreduce_compressed(got, "fp16:prescale").get_future().wait()
    assert fut[0] is not None and torch.equal(fut[0], got)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    result({"losses": losses})
    dist.destroy_process_group()


def scenario_wrapper(rank, world, init_method, outdir):
    """gradcomm.torch.DistributedDataParallel gives DDP's gradients, step by step."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    init(rank, world, init_method)
    torch.manual_seed(rank)  # different initial models: both must broadcast rank 0's
    ref = DDP(_model(), bucket_cap_mb=0.01)
    torch.manual_seed(rank)
    ours = gradcomm.torch.DistributedDataParallel(torch.nn.Sequential(*[m for m in _model()]), bucket_cap_mb=0.01,
                                                  first_bucket_mb=0.002)
    for a, b in zip(ref.module.parameters(), ours.module.parameters()):
        assert torch.equal(a, b), "initial parameters differ from DDP's (rank 0's)"
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05)
    worst = 0.0
    steps = 0
    for step, (x, y) in enumerate(_batches(rank, 12)):
        accumulate = step in (4, 5)  # two steps under no_sync, then one that sends the sum
        for model, opt in ((ref, opt_ref), (ours, opt_ours)):
            if not accumulate or step == 4:
                opt.zero_grad()
            ctx = model.no_sync() if accumulate else contextlib.nullcontext()
            with ctx:
                torch.nn.functional.mse_loss(model(x), y).backward()
        if accumulate:
            continue
        for (name, a), b in zip(ref.module.named_parameters(), ours.module.parameters()):
            worst = max(worst, (a.grad - b.grad).abs().max().item())
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7,
                                       msg=lambda m: f"step {step} gradient of {name}: {m}")
        opt_ref.step()
        opt_ours.step()
        steps += 1
    st = ours.last_step_stats()
    assert st["buckets"] >= 2 and st["bytes"] > 0, st
    buckets = len(ours.buckets())
    # No reference cycle through the autograd hooks: the wrapper goes as soon
    # as its last reference does, without the garbage collector.
    gone = weakref.ref(ours)
    gc.disable()
    del ours, opt_ours, model, opt  # (the loop's variables held it too)
    collected = gone() is None
    gc.enable()
    result({"max_grad_diff": worst, "steps": steps, "buckets": buckets, "stats": st, "collected": collected})
    dist.destroy_process_group()


def scenario_mismatch(rank, world, init_method, outdir, kind):
    """Ranks pass different shapes or dtypes: every rank raises, quickly."""
    init(rank, world, init_method, timeout_s=30)
    if kind == "shape":
        t = torch.ones(4 + rank)
    elif kind == "dtype":
        t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    elif kind == "unsupported-dtype":
        t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int16)  # gradcomm has no int16
    else:
        raise ValueError(kind)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        result({"error": str(e), "seconds": time.monotonic() - start})
        os._exit(0)  # the group is unusable now; do not wait in teardown
    raise AssertionError(f"rank {rank}: all_reduce of mismatched tensors returned {t}")


def scenario_device(rank, world, init_method, outdir):
    """Tensors on a device other than CPU or CUDA (meta): a clear error."""
    init(rank, world, init_method, timeout_s=30)
    msgs = {}
    try:
        torch.zeros(2, device="cuda")
        msgs["cuda"] = None
    except (RuntimeError, AssertionError) as e:  # no CUDA build, or no driver
        msgs["cuda"] = str(e)
    # torch 2.x serves meta tensors itself (shape propagation, no data):
    # the backend never sees them.
    before = gradcomm.torch.stats().get("allreduce", {}).get("calls", 0)
    dist.all_reduce(torch.zeros(2, device="meta"))
    msgs["dispatcher_calls"] = gradcomm.torch.stats().get("allreduce", {}).get("calls", 0) - before
    # The backend's own entry points refuse tensors that are neither CPU nor CUDA.
    try:
        gradcomm.torch.get_backend_group().allreduce_compressed(torch.zeros(2, device="meta"), "fp16")
        raise AssertionError("allreduce_compressed of a meta tensor returned")
    except RuntimeError as e:
        msgs["meta"] = str(e)
    result(msgs)
    os._exit(0)


def scenario_unsupported(rank, world, init_method, outdir):
    """Operations gradcomm does not have: errors that name what to use instead."""
    init(rank, world, init_method, timeout_s=30)
    msgs = {}

    def errors_of(calls):
        for name, call in calls:
            try:
                call()
                raise AssertionError(f"{name} returned")
            except RuntimeError as e:
                msgs[name] = str(e)

    errors_of([
        ("recv_anysource", lambda: dist.recv(torch.ones(2))),
        ("all_to_all", lambda: dist.all_to_all([torch.ones(1)] * world, [torch.ones(1)] * world)),
    ])
    # still usable: those never reached the communicator
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world)))
    # a reduction it cannot do fails that call on every rank; the group stays usable
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=R.BXOR)
        raise AssertionError("BXOR returned")
    except RuntimeError as e:
        msgs["BXOR"] = str(e)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(world * (world - 1) // 2))), t
    msgs["usable_after_rejection"] = True
    # Lists and sizes that do not fit the group: refused on the calling rank
    # before anything is issued (every rank here passes the same bad call).
    errors_of([
        ("allgather_list", lambda: dist.all_gather([torch.ones(2) for _ in range(world + 1)], torch.ones(2))),
        ("allgather_shape", lambda: dist.all_gather([torch.ones(3) for _ in range(world)], torch.ones(2))),
        ("allgather_base", lambda: dist.all_gather_into_tensor(torch.ones(3), torch.ones(2))),
        ("reduce_scatter_shape", lambda: dist.reduce_scatter(torch.ones(2), [torch.ones(3) for _ in range(world)])),
        ("reduce_scatter_base", lambda: dist.reduce_scatter_tensor(torch.ones(2), torch.ones(3))),
    ])
    t = torch.ones(3)
    dist.all_reduce(t)
    msgs["usable_after_bad_lists"] = torch.equal(t, torch.full((3,), float(world)))
    result(msgs)
    os._exit(0)


def scenario_reject_one_rank(rank, world, init_method, outdir):
    """Only rank 1 passes a tensor the backend rejects and goes on to its
    next call: every rank fails quickly (the call check), none hangs."""
    init(rank, world, init_method, timeout_s=30)
    start = time.monotonic()
    first = None
    try:
        if rank == 1:
            try:
                dist.all_reduce(torch.ones(4, dtype=torch.int16))  # gradcomm reduces no int16
                raise AssertionError("allreduce of int16 returned")
            except RuntimeError as e:
                first = str(e)
            dist.broadcast(torch.ones(4), src=0)  # the next call: not the allreduce rank 0 made
        else:
            dist.all_reduce(torch.ones(4))
        raise AssertionError(f"rank {rank}: the diverged calls returned")
    except RuntimeError as e:
        result({"first": first, "error": str(e), "seconds": time.monotonic() - start})
    os._exit(0)


def scenario_dead_rank(rank, world, init_method, outdir):
    """The last rank dies in the middle of training; the others raise
    within the process group's timeout."""
    timeout_s = 10
    init(rank, world, init_method, timeout_s=timeout_s)
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(_batches(rank, 50)):
        if step == 5 and rank == world - 1:
            os._exit(17)  # dies without a word
        if step == 5:
            died = time.monotonic()
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError as e:
            result({"step": step, "error": str(e), "seconds": time.monotonic() - died, "timeout": timeout_s})
            os._exit(0)
        opt.step()
    raise AssertionError(f"rank {rank}: training went on after rank {world - 1} died")


def scenario_wrong_world(rank, world, init_method, outdir):
    """Launched with world_size one larger than the ranks that exist."""
    start = time.monotonic()
    try:
        init(rank, world, init_method, timeout_s=5)
        raise AssertionError("init_process_group returned")
    except RuntimeError as e:
        result({"error": str(e), "seconds": time.monotonic() - start})
    os._exit(0)


def scenario_telemetry(rank, world, init_method, outdir):
    """GRADCOMM_TIMELINE and GRADCOMM_STATS through the backend."""
    init(rank, world, init_method)
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    stats = gradcomm.torch.stats()
    assert stats["allreduce"]["calls"] == 4, stats
    assert stats["allreduce"]["bytes"] == 4 * 4000, stats
    assert stats["broadcast"]["calls"] == 1, stats
    result({"stats": stats})
    dist.destroy_process_group()  # flushes the trace, prints the statistics


def _threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def scenario_groups(rank, world, init_method, outdir):
    """dist.new_group over gradcomm: subgroups of the default group, with
    their own ranks and sums, and (GRADCOMM_TORCH_GROUPS=shared) no new
    threads however many there are."""
    init(rank, world, init_method, timeout_s=30)
    # Warm the default group (its completion thread starts with it).
    t = torch.ones(4)
    dist.all_reduce(t)
    before = _threads()
    groups = {}
    for members in ([0, world - 1], list(range(1, world)), list(range(world))):
        g = dist.new_group(members, backend="gradcomm")
        if rank in members:
            groups[tuple(members)] = g
    many = [dist.new_group(backend="gradcomm") for _ in range(50)]
    after = _threads()
    for round_ in range(3):
        for members, g in groups.items():
            x = torch.full((5,), float(rank + round_))
            dist.all_reduce(x, group=g)
            want = float(sum(members) + round_ * len(members))
            assert torch.equal(x, torch.full((5,), want)), (members, x, want)
            assert dist.get_rank(g) == members.index(rank)
        y = torch.full((3,), float(rank))
        dist.all_reduce(y, group=many[round_ * 7])
        assert torch.equal(y, torch.full((3,), float(sum(range(world))))), y
    # An allgather on a group numbers its ranks as the group does.
    g = groups[tuple(range(1, world))] if rank >= 1 else None
    if g is not None:
        outs = [torch.zeros(1) for _ in range(world - 1)]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=g)
        assert [o.item() for o in outs] == [float(r) for r in range(1, world)], outs
    dist.barrier()
    print("RESULT " + json.dumps({"threads_before": before, "threads_after": after}))
    dist.destroy_process_group()


def scenario_coalesced(rank, world, init_method, outdir):
    """all_gather_into_tensor and reduce_scatter_tensor coalesced (as FSDP
    issues them) give Gloo's results; shutdown() through
    destroy_process_group leaves later calls a clear error."""
    init(rank, world, init_method, timeout_s=30)
    gloo = dist.new_group(backend="gloo")
    ins = [values(torch.float32, rank, 5, 1), values(torch.int64, rank, 3, 2), values(torch.float64, rank, 7, 3)]
    outs = [torch.empty(world * t.numel(), dtype=t.dtype) for t in ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, (o, i) in enumerate(zip(outs, ins)):
        want = torch.empty_like(o)
        dist.all_gather_into_tensor(want, i, group=gloo)
        assert torch.equal(o, want), (k, o, want)
    big = [values(torch.float32, rank, 4 * world, 4), values(torch.float64, rank, 2 * world, 5)]
    red = [torch.empty(t.numel() // world, dtype=t.dtype) for t in big]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(red, big):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k, (o, i) in enumerate(zip(red, big)):
        want = torch.empty_like(o)
        dist.reduce_scatter_tensor(want, i, group=gloo)
        assert torch.equal(o, want), (k, o, want)
    stats = gradcomm.torch.stats()
    assert stats["allgather_into_tensor_coalesced"]["calls"] == 1, stats
    assert stats["reduce_scatter_tensor_coalesced"]["calls"] == 1, stats
    pg = gradcomm.torch.get_backend_group()
    dist.destroy_process_group()
    try:
        pg.allreduce_compressed(torch.ones(2), "fp16")
        raise AssertionError("a call after shutdown returned")
    except RuntimeError as e:
        after = str(e)
    result({"after_shutdown": after})
    os._exit(0)


P2P_DTYPES = DTYPES + [torch.complex64, torch.int16]  # bytes move whatever the dtype


def _p2p_pair(pg, rank, world, t_send, t_recv, mode, tag=0):
    """rank sends t_send to rank+1 and receives t_recv from rank-1 through pg."""
    dst, src = (rank + 1) % world, (rank - 1) % world
    if mode == "async":  # both posted before either waits: needs them to run together
        works = [dist.isend(t_send, dst, group=pg, tag=tag), dist.irecv(t_recv, src, group=pg, tag=tag)]
        for w in works:
            w.wait()
    elif rank % 2 == 0:  # blocking, even ranks send first
        dist.send(t_send, dst, group=pg, tag=tag)
        dist.recv(t_recv, src, group=pg, tag=tag)
    else:
        dist.recv(t_recv, src, group=pg, tag=tag)
        dist.send(t_send, dst, group=pg, tag=tag)


def scenario_p2p(rank, world, init_method, outdir):
    """send/recv/isend/irecv: every dtype, both layouts, tags, large messages
    and collectives in between give what Gloo gives."""
    init(rank, world, init_method, timeout_s=30)
    gloo = dist.new_group(backend="gloo")
    pg = dist.group.WORLD  # torch 2.x: collectives take the ProcessGroup, not its backend
    src = (rank - 1) % world
    checked = 0
    n = 7
    for dtype in P2P_DTYPES:
        for mode in ("async", "blocking"):
            x = values(torch.float64 if dtype.is_complex else dtype, rank, n, 3).to(dtype)
            want = values(torch.float64 if dtype.is_complex else dtype, src, n, 3).to(dtype)
            ref = torch.zeros_like(x)
            _p2p_pair(gloo, rank, world, x.clone(), ref, mode)
            close(f"gloo {dtype}", ref, want)  # the reference itself is right
            for layout, t_send in layouts(x):
                for _, t_recv in layouts(torch.zeros_like(x)):
                    _p2p_pair(pg, rank, world, t_send, t_recv, mode)
                    close(f"{mode} send/recv {dtype} {layout} -> {t_recv.is_contiguous()}", t_recv, ref)
                    assert torch.equal(t_send, x), "send changed its tensor"
                    checked += 1
    # Tags: two messages to the same peer, received in the other order.
    dst = (rank + 1) % world
    for group, name in ((gloo, "gloo"), (pg, "gradcomm")):
        a, b = torch.full((5,), 10.0 * rank + 1), torch.full((5,), 10.0 * rank + 2)
        ra, rb = torch.zeros(5), torch.zeros(5)
        works = [dist.isend(a, dst, group=group, tag=2), dist.isend(b, dst, group=group, tag=1),
                 dist.irecv(rb, src, group=group, tag=1), dist.irecv(ra, src, group=group, tag=2)]
        for w in works:
            w.wait()
        close(f"{name} tag 2", ra, torch.full((5,), 10.0 * src + 1))
        close(f"{name} tag 1", rb, torch.full((5,), 10.0 * src + 2))
        checked += 2
    # Large messages both ways at once (a transport's rendezvous protocol,
    # where a send waits for its receive to be posted).
    big = torch.arange(1 << 20, dtype=torch.float32) + rank
    got = torch.zeros_like(big)
    _p2p_pair(pg, rank, world, big, got, "async")
    close("4 MiB isend/irecv", got, torch.arange(1 << 20, dtype=torch.float32) + src)
    checked += 1
    # Collectives between point-to-point calls keep their order; the
    # futures hold the tensors.
    for step in range(3):
        t_send = torch.full((3,), float(rank + step))
        t_recv = torch.zeros(3)
        ws = dist.isend(t_send, dst)
        wr = dist.irecv(t_recv, src)
        s = torch.ones(2)
        dist.all_reduce(s)
        assert torch.equal(s, torch.full((2,), float(world))), s
        fut = wr.get_future().wait()
        ws.wait()
        close("future of irecv", fut[0], torch.full((3,), float(src + step)))
        close("irecv after allreduce", t_recv, torch.full((3,), float(src + step)))
        checked += 1
    # batch_isend_irecv (torch calls isend/irecv for a backend other than NCCL).
    t_send, t_recv = torch.full((6,), float(rank)), torch.zeros(6)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t_send, dst), dist.P2POp(dist.irecv, t_recv, src)]):
        w.wait()
    close("batch_isend_irecv", t_recv, torch.full((6,), float(src)))
    checked += 1
    # A send completes on its own: rank 0's receive, issued first, needs
    # rank 1 to have both of rank 0's sends, the second issued only after
    # the first returned.
    if rank == 0:
        z = torch.zeros(3)
        r = dist.irecv(z, 1)
        dist.send(torch.full((3,), 1.0), 1)
        assert not r.is_completed(), "the reply came before it was sent"
        dist.send(torch.full((3,), 2.0), 1)
        r.wait()
        close("reply to two sends", z, torch.full((3,), 3.0))
    elif rank == 1:
        a, b = torch.zeros(3), torch.zeros(3)
        dist.recv(a, 0)
        dist.recv(b, 0)
        dist.send(a + b, 0)
    checked += 1
    # Rank 0 to every other rank and back (a star, not a ring).
    if rank == 0:
        for peer in range(1, world):
            dist.send(torch.full((4,), float(peer)), peer)
        back = [torch.zeros(4) for _ in range(1, world)]
        for peer, t in zip(range(1, world), back):
            dist.recv(t, peer)
            close(f"reply of rank {peer}", t, torch.full((4,), 2.0 * peer))
    else:
        t = torch.zeros(4)
        dist.recv(t, 0)
        dist.send(t * 2, 0)
    checked += 1
    stats = gradcomm.torch.stats()
    assert stats["send"]["calls"] > 0 and stats["recv"]["calls"] > 0, stats
    result({"checked": checked})
    dist.barrier()


def scenario_p2p_bad(rank, world, init_method, outdir, kind):
    """A send and its recv that disagree, or a bad peer or tag: a clear error
    on both ranks, quickly (never a hang or wrong data)."""
    init(rank, world, init_method, timeout_s=30)
    start = time.monotonic()
    peer = 1 - rank
    try:
        if kind == "count":  # the receiver's tensor is smaller
            t = torch.ones(8) if rank == 0 else torch.zeros(4)
        elif kind == "count-larger":  # the receiver's tensor is larger
            t = torch.ones(8) if rank == 0 else torch.zeros(16)
        elif kind == "dtype":  # same bytes, different dtype
            t = torch.ones(4) if rank == 0 else torch.zeros(4, dtype=torch.int32)
        elif kind in ("peer", "self", "tag"):
            t = torch.ones(4) if rank == 0 else torch.zeros(4)
            if rank == 0:
                if kind == "peer":
                    dist.send(t, 5)
                elif kind == "self":
                    # torch's own dist.send refuses this before any backend
                    # sees it; the backend's entry point checks too.
                    gradcomm.torch.get_backend_group().send([t], 0, 0).wait()
                else:
                    dist.send(t, 1, tag=100)
                raise AssertionError(f"send with a bad {kind} returned")
        else:
            raise ValueError(kind)
        if rank == 0:
            dist.send(t, peer)
        else:
            dist.recv(t, peer)
    except RuntimeError as e:
        result({"error": str(e), "seconds": time.monotonic() - start, "recv": t.tolist() if rank else None})
        os._exit(0)
    raise AssertionError(f"rank {rank}: {kind} mismatch returned {t}")


def _gathered(t):
    """Every rank's copy of t, stacked (float64)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts).double()


def scenario_gossip_average(rank, world, init_method, outdir):
    """GossipAverager over different per-rank tensors, no training: the ranks
    reach consensus, and synchronize() is the exact mean."""
    init(rank, world, init_method)
    pg = gradcomm.torch.get_backend_group()
    seed = 1234
    print(f"seed {seed}", flush=True)
    g = torch.Generator().manual_seed(seed + rank)
    tensors = [torch.randn(1000, generator=g) * 4 + 10 * rank, torch.randn(3, 5, generator=g) - rank,
               torch.zeros(0)]
    flat0 = torch.cat([t.reshape(-1) for t in tensors])
    all0 = _gathered(flat0)
    mean0 = all0.mean(0)
    spread0 = (all0 - mean0).abs().max().item()
    # RMS over ranks of the distance from the mean, as GossipStats measures it
    dist0 = (all0 - mean0).pow(2).sum(1).mean().sqrt().item()
    # Large staleness bound: on a loaded machine a push may arrive a few steps late; it must still be mixed.
    ptrs = [t.data_ptr() for t in tensors]
    avg = gradcomm.torch.GossipAverager(pg, tensors, max_staleness=16, consensus_distance=True)
    assert len(avg) == 3 and avg.numel() == 1015 and avg.weight() == 1.0
    distances = []
    for _ in range(30):
        avg.step()  # consensus_distance: two allreduces per step keep the ranks within a step of each other
        distances.append(avg.stats()["consensus_distance"])
    st = avg.stats()
    flat = torch.cat([t.reshape(-1) for t in tensors])
    # mixed in the tensors' own storage
    assert [t.data_ptr() for t in tensors] == ptrs, "the averager replaced the tensors' storage"
    before_sync = _gathered(flat)
    worst_from_mean0 = (flat.double() - mean0).abs().max().item()
    avg.synchronize()
    flat_sync = torch.cat([t.reshape(-1) for t in tensors])
    exact = before_sync.mean(0)
    sync_err = (flat_sync.double() - exact).abs().max().item()
    lo, hi = flat_sync.clone(), flat_sync.clone()
    dist.all_reduce(lo, op=R.MIN)
    dist.all_reduce(hi, op=R.MAX)
    assert torch.equal(lo, hi), "ranks differ after synchronize()"
    result({"dist0": dist0, "distances": distances, "spread0": spread0, "worst_from_mean0": worst_from_mean0,
            "sync_err": sync_err, "scale": exact.abs().max().item(), "stats": st, "weight_after": avg.weight(),
            "stats_after": avg.stats()})
    dist.destroy_process_group()


def _shard(rank):
    """Non-iid per-rank data: each rank sees its own region of input space,
    so training on one rank's data alone fits a different function."""
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(64, 16, generator=g) * 0.7 + (rank - 1) * 1.5
    return x, _target(x)


def _global_loss(module, rank):
    """The data-parallel objective: the mean over ranks of the local loss."""
    x, y = _shard(rank)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(module(x), y).reshape(1)
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()


def _train_gossip(rank, steps, lr, mix=True, **options):
    model = gradcomm.torch.GossipDataParallel(_model(), **options)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = _shard(rank)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if mix:
            model.gossip_step()
            # Pace the ranks as DDP's allreduce would (gossip itself never waits): on a loaded
            # machine a free-running rank could finish before its peers start, which tests nothing.
            dist.barrier()
    before = model.stats()
    model.synchronize()
    return model, before


def scenario_gossip_train(rank, world, init_method, outdir):
    """GossipDataParallel + SGD vs. allreduce data parallelism on the same problem."""
    init(rank, world, init_method)
    steps, lr = 200, 0.05
    initial = _global_loss(_model(), rank)
    ref = gradcomm.torch.DistributedDataParallel(_model())
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    x, y = _shard(rank)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    allreduce = _global_loss(ref.module, rank)
    # Three gossip trainings from the same start: each is asynchronous, so
    # its result depends on when pushes land (the test judges the median).
    gossip, stats = [], []
    for _ in range(3):
        model, st = _train_gossip(rank, steps, lr)
        gossip.append(_global_loss(model.module, rank))
        stats.append(st)
    # Control: the same local training with no mixing, averaged once at the end.
    local, _ = _train_gossip(rank, steps, lr, mix=False)
    local_then_average = _global_loss(local.module, rank)
    result({"initial": initial, "allreduce": allreduce, "gossip": gossip, "local_then_average": local_then_average,
            "stats": stats})
    # gradcomm's DistributedDataParallel sits in a reference cycle (its autograd hooks hold it), so
    # without a collection its group would outlive destroy_process_group() until interpreter exit,
    # where the group's completion thread can die releasing a tensor (a known backend issue).
    del model, local, ref, opt
    gc.collect()
    dist.destroy_process_group()


def scenario_gossip_bad(rank, world, init_method, outdir, kind):
    """Bad input to the gossip averager: an error on every rank, and the group stays usable."""
    init(rank, world, init_method, timeout_s=30)
    pg = gradcomm.torch.get_backend_group()
    good = [torch.ones(8), torch.ones(2, 3)]
    start = time.monotonic()
    error = None
    try:
        if kind == "dtype":
            gradcomm.torch.GossipAverager(pg, [good[0], good[1].double() if rank == 1 else good[1]])
        elif kind == "noncontiguous":
            gradcomm.torch.GossipAverager(pg, [good[0], torch.ones(3, 2).t() if rank == 1 else good[1]])
        elif kind == "device":
            gradcomm.torch.GossipAverager(pg, [torch.ones(8, device="meta") if rank == 1 else good[0], good[1]])
        elif kind == "sizes":
            gradcomm.torch.GossipAverager(pg, [torch.ones(8 + rank), good[1]])
        elif kind == "option":
            gradcomm.torch.GossipAverager(pg, good, max_staleness=-1 if rank == 0 else 0)
        elif kind == "empty":
            gradcomm.torch.GossipAverager(pg, [])
        elif kind == "wrapper-dtype":
            gradcomm.torch.GossipDataParallel(_model().double() if rank == 1 else _model())
        elif kind == "moved":
            t = torch.ones(8)
            avg = gradcomm.torch.GossipAverager(pg, [t])
            avg.step()
            t.resize_(1 << 20)  # reallocates: the averager's pointer is stale
            avg.step()
        elif kind == "wrapper-moved":
            model = gradcomm.torch.GossipDataParallel(_model())
            model.gossip_step()
            first = next(model.module.parameters())
            first.data = first.data.clone()
            model.gossip_step()
        else:
            raise ValueError(kind)
    except (RuntimeError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    seconds = time.monotonic() - start
    assert error is not None, f"rank {rank}: {kind} was accepted"
    # still usable: the checks agreed before anything else was collective
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [world * (world + 1) / 2] * 4, t
    result({"error": error, "seconds": seconds})
    dist.destroy_process_group()


def _rejected(call):
    """The error a call raised, or None when it returned."""
    try:
        call()
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


def scenario_devices(rank, world, init_method, outdir):
    """What runs without a GPU: the devices the backend is registered for,
    torch's backend for "cuda" (the gradcomm backend itself), and calls
    whose tensors are on two devices rejected on every rank before anything
    is issued (CPU with meta: the one other device every torch has; the
    first tensor the backend checks is the CPU one, so the meta one is
    refused for joining it, not for being meta)."""
    init(rank, world, init_method, timeout_s=30)
    out = {"capability": list(dist.Backend.backend_capability["gradcomm"]), "devices": gradcomm.torch.devices(),
           "cuda_supported": gradcomm.torch.cuda_supported, "torch_cuda": torch.version.cuda}
    default = dist.distributed_c10d._get_default_group()
    ours = gradcomm.torch.get_backend_group()
    try:
        out["cuda_backend"] = type(default._get_backend(torch.device("cuda"))).__name__
        out["cuda_backend_is_ours"] = default._get_backend(torch.device("cuda")) is ours
    except (RuntimeError, ValueError) as e:
        out["cuda_backend"] = "none: " + str(e)
        out["cuda_backend_is_ours"] = False
    cpu = lambda n=4: torch.ones(n)  # noqa: E731
    meta = lambda n=4: torch.ones(n, device="meta")  # noqa: E731
    mixed = {
        "allreduce_coalesced": lambda: ours.allreduce_coalesced([cpu(), meta()]),
        "allgather": lambda: ours.allgather([[meta() for _ in range(world)]], [cpu()]),
        "allgather_base": lambda: ours._allgather_base(meta(4 * world), cpu()),
        "reduce_scatter": lambda: ours.reduce_scatter([cpu()], [[cpu(), meta()] + [cpu() for _ in range(world - 2)]]),
        "reduce_scatter_base": lambda: ours._reduce_scatter_base(meta(), cpu(4 * world)),
        "alltoall_base": lambda: ours.alltoall_base(meta(2 * world), cpu(2 * world), [], []),
    }
    out["mixed"] = {name: _rejected(call) for name, call in mixed.items()}
    out["all_meta"] = _rejected(lambda: ours.allreduce_coalesced([meta(), meta()]))
    # Nothing was issued: the group is usable and in step on every rank.
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out["usable_after"] = t.tolist() == [world * (world + 1) / 2] * 3
    result(out)
    dist.destroy_process_group()


def scenario_cuda(rank, world, init_method, outdir):
    """CUDA tensors through the gradcomm backend (needs a GPU): every
    collective against values computed here, stream order at issue and at
    wait, the Work's future and its then(), DDP against Gloo on CPU, and
    calls mixing devices rejected."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    rank, world = init(rank, world, init_method, timeout_s=60)
    checked = 0
    every = lambda dtype, n, seed: [values(dtype, r, n, seed) for r in range(world)]  # noqa: E731

    # all_reduce: dtypes, SUM/MAX/AVG, contiguous and strided.
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64):
        for op_name in ("SUM", "MAX", "AVG"):
            if not reducible(dtype, op_name):
                continue
            xs = every(dtype, 1000, 1)
            stacked = torch.stack([x.double() for x in xs])
            want = {"SUM": stacked.sum(0), "MAX": stacked.max(0).values, "AVG": stacked.mean(0)}[op_name].to(dtype)
            for layout in ("contiguous", "strided"):
                t = xs[rank].to(dev)
                if layout == "strided":
                    big = torch.zeros(2 * t.numel(), dtype=dtype, device=dev)
                    big[::2].copy_(t)
                    t = big[::2]
                dist.all_reduce(t, op=OPS[op_name])
                assert t.is_cuda
                close(f"all_reduce {dtype} {op_name} {layout}", t.cpu(), want)
                checked += 1

    # Order at issue: the input is written by work queued on a side stream
    # (after a sleep) and the call is issued from that stream without any
    # synchronisation; after wait(), work on that stream sees the result.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            x = torch.zeros(1 << 20, device=dev)
            torch.cuda._sleep(50_000_000)  # tens of ms of GPU time before the fill
            x.fill_(rank + 1)
            w = dist.all_reduce(x, async_op=True)
            w.wait()
            y = x * 2  # on s, after wait()
            got = y.cpu()  # synchronises s
            assert torch.all(got == 2 * world * (world + 1) / 2), got[:4]
            checked += 1
    torch.cuda.synchronize()

    # The future: value and then() on CUDA tensors (as DDP's comm hooks use it).
    x = torch.full((1000,), float(rank + 1), device=dev)
    fut = dist.all_reduce(x, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert doubled.is_cuda and torch.all(doubled.cpu() == world * (world + 1)), doubled[:4]
    checked += 1

    # Many calls in flight on strided tensors (the backend reduces a
    # contiguous copy of its own and copies back on its side stream; it
    # drops the copy on the host while that copy may still be queued),
    # with allocations in between that may reuse freed blocks.
    works, outs = [], []
    for i in range(20):
        big = torch.full((2000,), float(rank + i), device=dev)
        t = big[::2]
        works.append(dist.all_reduce(t, async_op=True))
        outs.append(t)
        del big  # t still holds its storage
        _ = torch.full((4096,), -7.0, device=dev)
    for i, (w, t) in enumerate(zip(works, outs)):
        w.wait()
        want = float(sum(r + i for r in range(world)))
        assert torch.all(t.cpu() == want), (i, t[:4])
    checked += 1

    # The other collectives.
    n = 64
    xs = every(torch.float32, n, 2)
    t = xs[rank].to(dev)
    dist.broadcast(t, src=world - 1)
    close("broadcast", t.cpu(), xs[world - 1])
    t = xs[rank].to(dev)
    dist.reduce(t, dst=0)
    if rank == 0:
        close("reduce", t.cpu(), torch.stack(xs).sum(0))
    outs = [torch.empty(n, device=dev) for _ in range(world)]
    dist.all_gather(outs, xs[rank].to(dev))
    for r in range(world):
        close(f"all_gather[{r}]", outs[r].cpu(), xs[r])
    flat = torch.empty(world * n, device=dev)
    dist.all_gather_into_tensor(flat, xs[rank].to(dev))
    close("all_gather_into_tensor", flat.cpu(), torch.cat(xs))
    parts = [every(torch.float32, n, 10 + r) for r in range(world)]  # parts[r][j]: rank j's input for rank r
    out = torch.empty(n, device=dev)
    dist.reduce_scatter(out, [parts[r][rank].to(dev) for r in range(world)])
    close("reduce_scatter", out.cpu(), torch.stack(parts[rank]).sum(0))
    ins = torch.cat([values(torch.float32, rank, n, 20 + r) for r in range(world)]).to(dev)
    out = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(out, ins)
    close("reduce_scatter_tensor", out.cpu(), torch.stack([values(torch.float32, j, n, 20 + rank)
                                                           for j in range(world)]).sum(0))
    ins = torch.arange(world * 4, dtype=torch.float32) + 100 * rank
    out = torch.empty(world * 4, device=dev)
    dist.all_to_all_single(out, ins.to(dev))
    want = torch.cat([torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32) + 100 * j for j in range(world)])
    close("all_to_all_single", out.cpu(), want)
    g = [torch.empty(n, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(xs[rank].to(dev), g, dst=0)
    if rank == 0:
        for r in range(world):
            close(f"gather[{r}]", g[r].cpu(), xs[r])
    out = torch.empty(n, device=dev)
    dist.scatter(out, [x.to(dev) for x in xs] if rank == 0 else None, src=0)
    close("scatter", out.cpu(), xs[rank])
    if world >= 2 and rank < 2:
        peer = 1 - rank
        if rank == 0:
            dist.send(xs[0].to(dev), dst=peer)
        else:
            got = torch.empty(n, device=dev)
            dist.recv(got, src=peer)
            close("send/recv", got.cpu(), xs[0])
    dist.barrier()
    checked += 10

    # A call mixing devices is rejected before anything is issued.
    ours = gradcomm.torch.get_backend_group()
    out_msgs = {"cpu_and_cuda": _rejected(
        lambda: ours.allgather([[torch.zeros(4) for _ in range(world)]], [torch.ones(4, device=dev)]))}
    if torch.cuda.device_count() >= 2:
        other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
        out_msgs["two_cuda_devices"] = _rejected(
            lambda: ours._allgather_base(torch.zeros(4 * world, device=dev), torch.ones(4, device=other)))
    x = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert torch.all(x.cpu() == world * (world + 1) / 2), x
    checked += 1

    # DDP on CUDA (the future path of the default comm hook) against Gloo on CPU.
    from torch.nn.parallel import DistributedDataParallel as DDP
    gc_group = dist.new_group(backend="gradcomm")
    gloo = dist.new_group(backend="gloo")
    model_gc = DDP(_model().to(dev), device_ids=[dev.index], process_group=gc_group, bucket_cap_mb=1)
    model_gl = DDP(_model(), process_group=gloo, bucket_cap_mb=1)
    opt_gc = torch.optim.SGD(model_gc.parameters(), lr=0.05)
    opt_gl = torch.optim.SGD(model_gl.parameters(), lr=0.05)
    for x, y in _batches(rank, 20):
        for model, opt, d in ((model_gc, opt_gc, dev), (model_gl, opt_gl, torch.device("cpu"))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(d)), y.to(d)).backward()
            opt.step()
    worst = 0.0
    for (name, a), b in zip(model_gc.module.named_parameters(), model_gl.module.parameters()):
        worst = max(worst, (a.detach().cpu() - b.detach()).abs().max().item())
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"DDP parameter {name}: {m}")
    checked += 1
    result({"rank": rank, "checked": checked, "errors": out_msgs, "ddp_max_param_diff": worst,
            "device": str(dev), "devices": torch.cuda.device_count()})
    dist.destroy_process_group()


class _TwoDevices(torch.nn.Module):
    """A parameter on the CPU and one on `other` (meta here: a device no GPU is needed for)."""

    def __init__(self, other):
        super().__init__()
        self.a = torch.nn.Parameter(torch.ones(4))
        self.b = torch.nn.Parameter(torch.ones(4, device=other))


def scenario_wrapper_devices(rank, world, init_method, outdir):
    """DistributedDataParallel and GossipDataParallel on modules whose
    parameters are on more than one device, or on a device neither CPU nor
    CUDA: a clear error on construction, and the group stays usable."""
    from types import SimpleNamespace

    from gradcomm.torch.parallel import check_one_device
    init(rank, world, init_method, timeout_s=30)
    errors = {}
    for name, make in (("ddp_cpu_and_meta", lambda: gradcomm.torch.DistributedDataParallel(_TwoDevices("meta"))),
                       ("ddp_all_meta", lambda: gradcomm.torch.DistributedDataParallel(_model().to("meta"))),
                       ("gossip_cpu_and_meta", lambda: gradcomm.torch.GossipDataParallel(_TwoDevices("meta")))):
        try:
            make()
            errors[name] = None
        except (ValueError, RuntimeError) as e:
            errors[name] = f"{type(e).__name__}: {e}"
    # The C++ Reducer's own check (the wrapper's is first).
    pg = gradcomm.torch.get_backend_group()
    errors["reducer_cpu_and_meta"] = _rejected(
        lambda: gradcomm.torch._C.Reducer(pg, [torch.ones(3), torch.ones(3, device="meta")]))
    # Devices only a GPU machine can make tensors on: the wrapper's check
    # sees only each parameter's device, so stand-ins carry them.
    fake = lambda d: SimpleNamespace(device=torch.device(d))  # noqa: E731
    for name, named in (("cpu_and_cuda", [("w", fake("cpu")), ("v", fake("cuda:0"))]),
                        ("two_cuda", [("w", fake("cuda:0")), ("v", fake("cuda:1")), ("u", fake("cuda:1"))])):
        errors[name] = _rejected(lambda: check_one_device(named, "DDP"))
    one = check_one_device([("w", fake("cpu")), ("v", fake("cpu"))], "DDP")
    # Still usable: nothing collective ran before the errors.
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [world * (world + 1) / 2] * 4, t
    result({"errors": errors, "one": str(one)})
    dist.destroy_process_group()


def _cuda_device(rank):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def _slow_backward(model):
    """Delays the gradients on the GPU (~tens of ms of device time at the
    output): a missing stream order would read them before they exist."""
    def hook(m, inp, out):
        if out.requires_grad:
            out.register_hook(lambda g: (torch.cuda._sleep(20_000_000), g)[1])
    model.register_forward_hook(hook)
    return model


def scenario_cuda_wrappers(rank, world, init_method, outdir):
    """gradcomm.torch.DistributedDataParallel on a CUDA model (needs a GPU):
    the same parameters as torch's DDP on Gloo on the CPU, trained on the
    default stream and on a side stream."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    init(rank, world, init_method)
    dev = _cuda_device(rank)
    gloo = dist.new_group(backend="gloo")
    ref = DDP(_model(), process_group=gloo, bucket_cap_mb=1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    for x, y in _batches(rank, 20):
        opt_ref.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt_ref.step()
    out = {"rank": rank, "device": str(dev)}
    for where in ("default", "side"):
        # Small buckets: several allreduces, launched during backward.
        model = gradcomm.torch.DistributedDataParallel(_slow_backward(_model().to(dev)), bucket_cap_mb=0.002,
                                                       first_bucket_mb=0.001)
        assert model.device == dev and model._reducer.device == str(dev), (model.device, model._reducer.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        stream = torch.cuda.Stream() if where == "side" else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())  # the parameters as constructed and broadcast
        with torch.cuda.stream(stream):
            for x, y in _batches(rank, 20):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
                opt.step()
        torch.cuda.synchronize()
        worst = 0.0
        for (name, a), b in zip(model.module.named_parameters(), ref.module.parameters()):
            assert a.is_cuda, name
            worst = max(worst, (a.detach().cpu() - b.detach()).abs().max().item())
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{where} stream, parameter {name}: {m}")
        out[f"max_param_diff_{where}"] = worst
        out[f"buckets_{where}"] = len(model.buckets())
        del model, opt
        gc.collect()
    result(out)
    dist.destroy_process_group()


def scenario_gossip_cuda(rank, world, init_method, outdir):
    """GossipDataParallel on a CUDA model (needs a GPU): synchronize() gives
    the exact mean of the ranks' parameters, gossip steps mix them, and
    training lowers the loss as on the CPU."""
    init(rank, world, init_method)
    dev = _cuda_device(rank)
    model = gradcomm.torch.GossipDataParallel(_model().to(dev))
    params = list(model.module.parameters())
    assert all(p.is_cuda for p in params)
    # Rank-specific values, queued on the current stream (the staging copy must wait for them).
    with torch.no_grad():
        torch.cuda._sleep(20_000_000)
        for i, p in enumerate(params):
            p.fill_(float(rank + 1) * (i + 1))
    model.synchronize()
    mean = (world + 1) / 2
    for i, p in enumerate(params):
        want = torch.full_like(p, mean * (i + 1))
        torch.testing.assert_close(p.detach(), want, msg=lambda m: f"synchronize, parameter {i}: {m}")
    # One gossip step from distinct values: every value moves towards the others' and stays within their range.
    with torch.no_grad():
        for p in params:
            p.fill_(float(rank + 1))
    for _ in range(5):
        dist.barrier()
        time.sleep(0.01)  # the peer's push lands (loopback)
        model.gossip_step()
    flat = torch.cat([p.detach().reshape(-1) for p in params]).cpu()
    moved = bool((flat != float(rank + 1)).all())
    assert moved, f"rank {rank}: five gossip steps left the parameters at this rank's own value"
    assert flat.min().item() >= 1 - 1e-5 and flat.max().item() <= world + 1e-5, (flat.min(), flat.max())
    st = model.stats()
    # Training: the loss falls as on the CPU (the same problem as scenario_gossip_train).
    model = gradcomm.torch.GossipDataParallel(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _shard(rank)
    x, y = x.to(dev), y.to(dev)
    def global_loss():  # the mean over ranks of the local loss
        with torch.no_grad():
            loss = torch.nn.functional.mse_loss(model(x), y).reshape(1)
        dist.all_reduce(loss)
        return loss.item() / world

    start_loss = global_loss()
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        model.gossip_step()
        dist.barrier()
    model.synchronize()
    end_loss = global_loss()
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=R.MIN)
    dist.all_reduce(hi, op=R.MAX)
    assert torch.equal(lo, hi), "ranks differ after synchronize()"
    result({"rank": rank, "moved": moved, "received": st["received"], "start_loss": start_loss,
            "end_loss": end_loss})
    dist.destroy_process_group()


SCENARIOS = {k[len("scenario_"):]: v for k, v in globals().items() if k.startswith("scenario_")}

if __name__ == "__main__":
    name, rank, world, init_method, outdir, *extra = sys.argv[1:]
    try:
        SCENARIOS[name](int(rank), int(world), init_method, outdir, *extra)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
