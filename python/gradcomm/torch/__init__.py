"""gradcomm as a torch.distributed backend (PyTorch 2.x, CPU and CUDA tensors).

Importing this module registers the backend ``"gradcomm"``::

    import gradcomm.torch
    import torch.distributed as dist
    dist.init_process_group("gradcomm")   # env:// (torchrun), tcp://... or file://...

The communicator is formed through the store ``init_process_group`` made;
its timeout is the process group's. Groups made later with
``dist.new_group(ranks, backend="gradcomm")`` are subgroups of it
(``Communicator::subgroup``): they share its connections and its threads,
so a group costs about 1 ms and a few KiB; their calls and the default
group's run in the order each process issues them, so ranks must issue the
calls of groups they share in one consistent order (as with NCCL).
``GRADCOMM_TORCH_GROUPS=separate`` gives every group a communicator of its
own instead (its own connections and threads; calls of different groups
then progress independently).

On a torch built with CUDA the backend is registered for ``"cpu"`` and
``"cuda"`` (``devices()``), so CUDA tensors come to it too. A call on CUDA
tensors is ordered after the work queued on the current stream of their
device; ``Work.wait()`` (and the Work's future) blocks the host until the
communication finished and makes the current stream wait for the copy of
the result into the tensors, as with NCCL. A call's tensors must all be on
one device (CPU, or one CUDA device per group); send and recv of CUDA
tensors first wait on the host for the current stream.
"""
import os

import torch
import torch.distributed as dist

from ._C import ErrorFeedback, ProcessGroupGradcomm, __version__, cuda_supported  # noqa: F401

BACKEND_NAME = "gradcomm"


_GROUP_MODES = ("shared", "separate")
# The default group's backend: later groups are its subgroups.
_default_group = None


def _groups_mode():
    mode = os.environ.get("GRADCOMM_TORCH_GROUPS", "shared").strip().lower() or "shared"
    if mode not in _GROUP_MODES:
        raise ValueError(f"GRADCOMM_TORCH_GROUPS='{mode}' is not valid: expected one of {', '.join(_GROUP_MODES)}")
    return mode


def _create_process_group(opts, backend_options=None):
    """The creator torch.distributed calls for backend "gradcomm" (torch's
    extended API: ``opts`` names the group's global ranks)."""
    global _default_group
    mode = _groups_mode()
    ranks = list(opts.global_ranks_in_group)
    if ranks and mode == "shared" and _default_group is not None:
        # A new_group: only its members call this, which subgroup allows.
        return _default_group.subgroup(ranks, opts.timeout)
    pg = ProcessGroupGradcomm(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    if not ranks:  # the default group (torch passes no ranks for it)
        _default_group = pg
    return pg


def devices():
    """The device types the backend takes: ``["cpu", "cuda"]`` on a torch
    built with CUDA (``torch.version.cuda``) when this build of the
    extension takes CUDA tensors (``cuda_supported``), else ``["cpu"]``."""
    if cuda_supported and getattr(torch.version, "cuda", None):
        return ["cpu", "cuda"]
    return ["cpu"]


def _register():
    # Importing twice (or reloading) must not register twice.
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=devices())


_register()


def get_backend_group(group=None):
    """The ProcessGroupGradcomm behind ``group`` (default: the world group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupGradcomm):
        try:
            # torch 2.x: a ProcessGroup holds one backend per device type.
            pg = pg._get_backend(torch.device("cpu"))
        except (AttributeError, RuntimeError, ValueError):
            pass
    if not isinstance(pg, ProcessGroupGradcomm):
        raise RuntimeError(
            "gradcomm.torch: the process group uses backend "
            f"'{dist.get_backend(pg)}', not 'gradcomm'; call "
            "dist.init_process_group('gradcomm') or dist.new_group(backend='gradcomm')")
    return pg


def stats(group=None):
    """Per collective: calls, bytes and summed running time (ms) so far."""
    return get_backend_group(group).stats()


__all__ = ["BACKEND_NAME", "ErrorFeedback", "ProcessGroupGradcomm", "devices", "get_backend_group", "stats"]

from .parallel import DistributedDataParallel  # noqa: E402  (needs get_backend_group above)

__all__.append("DistributedDataParallel")

from ._C import GossipAverager  # noqa: E402,F401
from .gossip import GossipDataParallel  # noqa: E402

__all__ += ["GossipAverager", "GossipDataParallel"]
