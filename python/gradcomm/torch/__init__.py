"""gradcomm as a torch.distributed backend (PyTorch 2.x, CPU tensors).

Importing this module registers the backend ``"gradcomm"``::

    import gradcomm.torch
    import torch.distributed as dist
    dist.init_process_group("gradcomm")   # env:// (torchrun), tcp://... or file://...

The communicator is formed through the store ``init_process_group`` made;
its timeout is the process group's.
"""
import torch
import torch.distributed as dist

from ._C import ErrorFeedback, ProcessGroupGradcomm, __version__  # noqa: F401

BACKEND_NAME = "gradcomm"


def _create_process_group(store, rank, world_size, timeout):
    """The creator torch.distributed calls for backend "gradcomm"."""
    return ProcessGroupGradcomm(store, rank, world_size, timeout)


def _register():
    # Importing twice (or reloading) must not register twice.
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu"])


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


__all__ = ["BACKEND_NAME", "ErrorFeedback", "ProcessGroupGradcomm", "get_backend_group", "stats"]

from .parallel import DistributedDataParallel  # noqa: E402  (needs get_backend_group above)

__all__.append("DistributedDataParallel")

from ._C import GossipAverager  # noqa: E402,F401
from .gossip import GossipDataParallel  # noqa: E402

__all__ += ["GossipAverager", "GossipDataParallel"]
