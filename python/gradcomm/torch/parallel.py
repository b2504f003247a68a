"""gradcomm.torch.DistributedDataParallel: data parallelism driven by gradcomm's Reducer.

A thin wrapper: autograd's per-parameter hooks hand each finished gradient
to gradcomm's C++ Reducer, which packs buckets (small first bucket, then
GRADCOMM_BUCKET_CAP), launches each as soon as it is complete (in
partitions, overlapped with the rest of backward), rebuilds them once in
the order gradients actually arrived, and averages them; at the end of
backward the averaged gradients are written back into ``param.grad``.

    model = gradcomm.torch.DistributedDataParallel(model)   # on a "gradcomm" group

CUDA models: when every parameter is on one CUDA device, the buckets live
on that device and the Reducer runs in device mode (buckets staged through
pinned host memory for the transport), ordered after torch's current
stream: gradients are copied into the buckets on the stream autograd
produced them on, and the averaged gradients are written back into
``param.grad`` on the stream current at ``backward()``, so the optimizer
step that follows reads them complete. Parameters on more than one device
(CPU and CUDA, or two CUDA devices) are a ValueError at construction.

Per-step statistics (``last_step_stats()``, or GRADCOMM_STATS=1) and the
timeline (GRADCOMM_TIMELINE) are the Reducer's, as in C++.
"""
import contextlib
import weakref

import torch
import torch.distributed as dist

from . import _C, cuda_supported, get_backend_group


def _names_by_device(named):
    by = {}
    for name, p in named:
        by.setdefault(p.device, []).append(name)
    return by


def _listed(names, most=3):
    shown = ", ".join(f"'{n}'" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def check_one_device(named, who):
    """The one device (CPU or one CUDA device) of the parameters
    ``named`` ((name, parameter) pairs); a ValueError naming the
    parameters and their devices otherwise. None when there are none."""
    by = _names_by_device(named)
    for device, names in by.items():
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{who}: parameter(s) {_listed(names)} are on {device}; parameters must be on the "
                             "CPU or on one CUDA device")
    if len(by) > 1:
        where = "; ".join(f"{device}: {_listed(names)}" for device, names in by.items())
        raise ValueError(f"{who}: the module's parameters are on {len(by)} devices ({where}); every parameter "
                         "must be on one device (the CPU or a single CUDA device): move the module with "
                         "module.to(device) first")
    device = next(iter(by), None)
    if device is not None and device.type == "cuda" and not cuda_supported:
        raise ValueError(f"{who}: the parameters are on {device} but this build of gradcomm.torch takes CPU "
                         "tensors only (built against a torch without c10::Stream::native_handle)")
    return device


class DistributedDataParallel(torch.nn.Module):
    """Averages the gradients of ``module``'s parameters over the ranks of
    ``process_group`` (a gradcomm group; default: the world group) during
    backward. Parameters and buffers are broadcast from rank 0 at
    construction, as torch's DDP does. ``compression``: "fp16", "bf16",
    "topk:0.01", ... for float32 buckets (with error feedback).

    The parameters (those that require gradients) must all be on the CPU or
    all on one CUDA device (``self.device``); construct the wrapper after
    ``module.to(device)``, with the stream the training loop uses current
    (any stream works; others are ordered with events)."""

    def __init__(self, module, process_group=None, bucket_cap_mb=25, first_bucket_mb=1, compression="",
                 broadcast_buffers=True):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        # Before anything collective: a bad module is an error on this rank at once.
        self.device = check_one_device(named, "gradcomm.torch.DistributedDataParallel")
        pg = get_backend_group(process_group)
        self._params = [p for _, p in named]
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
