"""DDP communication hooks that compress gradients with gradcomm's kernels.

Each hook sends a bucket as one collective call into the backend
(``ProcessGroupGradcomm.allreduce_compressed``): compression, the
collective, decompression and error feedback all run in C++ on the
backend's threads; nothing is reshuffled in Python::

    import gradcomm.torch
    from gradcomm.torch import hooks
    model = DistributedDataParallel(model)          # on a "gradcomm" group
    model.register_comm_hook(hooks.CompressionState(), hooks.fp16_hook)
    model.register_comm_hook(hooks.CompressionState(), hooks.topk_hook(0.01))

Compression applies to float32 buckets (others are averaged exactly). The
result is the average over ranks, as with DDP's default hook.
"""
from . import ErrorFeedback, get_backend_group


class CompressionState:
    """What a compression hook keeps between steps: the group and the error
    feedback of each bucket (what compression has not sent yet).

    ``process_group``: the gradcomm group (default: the world group).
    ``error_feedback``: carry the compression error into the next step
    (None: gradcomm's default, on for top-k, off for fp16/bf16).
    """

    def __init__(self, process_group=None, error_feedback=None):
        self.process_group = process_group
        self.error_feedback = error_feedback
        self._feedback = {}

    def feedback_for(self, bucket):
        """The ErrorFeedback of this bucket, kept here (gradcomm keeps none
        per buffer address). One per bucket index: DDP rebuilds its buckets
        once, after the first step; a rebuilt bucket (other size or first
        parameter) replaces the old one's and starts with no carried error."""
        params = bucket.parameters()
        shape = (bucket.buffer().numel(), params[0].data_ptr() if params else 0)
        entry = self._feedback.get(bucket.index())
        if entry is None or entry[0] != shape:
            entry = self._feedback[bucket.index()] = (shape, ErrorFeedback())
        return entry[1]

    def spec(self, compression):
        if self.error_feedback is None:
            return compression
        return f"{compression}:ef={1 if self.error_feedback else 0}"


def _compressed(state, bucket, compression):
    if state is None:
        state = CompressionState()
    pg = get_backend_group(state.process_group)
    feedback = state.feedback_for(bucket)
    work = pg.allreduce_compressed(bucket.buffer(), state.spec(compression), feedback)
    # The work's future completes with [bucket tensor]; a Python hook must
    # hand DDP a future of the tensor itself.
    return work.get_future().then(_first)


def _first(fut):
    return fut.value()[0]


def fp16_hook(state, bucket):
    """Averages the bucket sent as float16 (pre-scaled by 1/world_size so the
    sum cannot overflow; saturating, round to nearest even)."""
    return _compressed(state, bucket, "fp16:prescale")


def bf16_hook(state, bucket):
    """Averages the bucket sent as bfloat16 (float32's range, 8 bits of mantissa)."""
    return _compressed(state, bucket, "bf16")


def topk_hook(ratio, exact=False):
    """A hook that sends only the largest ``ratio`` of each bucket's
    magnitudes (e.g. 0.01) as a sparse payload; what is not sent is kept
    (error feedback) and added to the next step's gradient. ``exact``:
    exactly k values, else a sampled threshold (within 10% of k, faster)."""
    ratio = float(ratio)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"topk_hook: ratio must be in (0, 1], got {ratio}")
    spec = f"topk:{ratio!r}" + (":exact" if exact else "")

    def hook(state, bucket):
        return _compressed(state, bucket, spec)

    hook.__name__ = hook.__qualname__ = f"topk_hook({ratio!r})"
    return hook


__all__ = ["CompressionState", "fp16_hook", "bf16_hook", "topk_hook"]
