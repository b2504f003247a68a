"""gradcomm.torch.DistributedDataParallel: data parallelism driven by gradcomm's Reducer.

A thin wrapper: autograd's per-parameter hooks hand each finished gradient
to gradcomm's C++ Reducer, which packs buckets (small first bucket, then
GRADCOMM_BUCKET_CAP), launches each as soon as it is complete (in
partitions, overlapped with the rest of backward), rebuilds them once in
the order gradients actually arrived, and averages them; at the end of
backward the averaged gradients are written back into ``param.grad``.

    model = gradcomm.torch.DistributedDataParallel(model)   # on a "gradcomm" group

Per-step statistics (``last_step_stats()``, or GRADCOMM_STATS=1) and the
timeline (GRADCOMM_TIMELINE) are the Reducer's, as in C++.
"""
import contextlib
import weakref

import torch
import torch.distributed as dist

from . import _C, get_backend_group


class DistributedDataParallel(torch.nn.Module):
    """Averages the gradients of ``module``'s parameters over the ranks of
    ``process_group`` (a gradcomm group; default: the world group) during
    backward. Parameters and buffers are broadcast from rank 0 at
    construction, as torch's DDP does. ``compression``: "fp16", "bf16",
    "topk:0.01", ... for float32 buckets (with error feedback)."""

    def __init__(self, module, process_group=None, bucket_cap_mb=25, first_bucket_mb=1, compression="",
                 broadcast_buffers=True):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        pg = get_backend_group(process_group)
        self._params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            self._broadcast(list(module.state_dict().values()))
        self._reducer = _C.Reducer(pg, [p.detach() for p in self._params],
                                   bucket_cap_bytes=int(bucket_cap_mb * 2**20),
                                   first_bucket_bytes=int(first_bucket_mb * 2**20), compression=compression)
        self._sync = True
        self._step_open = False
        self._ready = [False] * len(self._params)
        self._accumulators = []  # keep the AccumulateGrad nodes (and their hooks) alive
        for i, p in enumerate(self._params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(i, p))
            self._accumulators.append(acc)

    def _broadcast(self, tensors):
        works = [dist.broadcast(t, src=0, group=self.process_group, async_op=True) for t in tensors]
        for w in works:
            w.wait()

    def _make_hook(self, i, p):
        # The hook lives on the parameter's AccumulateGrad node, which this
        # wrapper keeps: a strong reference back would make a cycle through
        # C++ that Python's collector cannot see, keeping the wrapper (and its
        # process group) alive until interpreter shutdown, where destroying
        # the group's threads can abort the process.
        owner = weakref.ref(self)

        def hook(*_):
            self = owner()
            if self is None:
                return
            if not self._sync:
                return  # no_sync(): autograd accumulates into p.grad; the next synchronised step sends the sum
            if not self._step_open:
                self._step_open = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            self._ready[i] = True
            self._reducer.grad_ready(i, p.grad)
        return hook

    def _finalize(self):
        self._step_open = False
        for i, p in enumerate(self._params):
            if not self._ready[i]:
                self._reducer.mark_unused(i)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._ready = [False] * len(self._params)
        self._reducer.finalize([p.grad for p in self._params])

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self._sync:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                with torch.no_grad():
                    self._broadcast(buffers)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Steps inside accumulate gradients locally; the first step after
        sends the accumulated sum (as torch's DDP.no_sync)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def last_step_stats(self):
        """The Reducer's statistics of the last step: step_ms, comm_ms,
        exposed_ms, hidden_ms, compute_ms, utilization, buckets, bytes."""
        return self._reducer.last_step_stats()

    def buckets(self):
        """Parameter indices of each bucket, in launch order."""
        return self._reducer.buckets()
