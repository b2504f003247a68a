"""gradcomm.torch.GossipDataParallel: decentralised data parallelism by push-sum gossip (SGP).

Instead of averaging gradients in backward (an allreduce that waits for the
slowest rank), every rank steps its optimizer on its own gradients and then
mixes its parameters with one peer's (``gossip_step()``), through gradcomm's
C++ GossipAverager: push-sum over a time-varying directed exponential graph
(Stochastic Gradient Push, Assran et al. 2019). A step never waits for a
peer; ``synchronize()`` makes the parameters the exact average (an
allreduce), for evaluation or checkpoints.

CUDA models are staged through host memory: the averager works on pinned
host copies of the CUDA parameters; ``gossip_step()`` and
``synchronize()`` copy the parameters to them on the current stream, wait
for that stream, mix on the host, and queue the copies back on the current
stream (so work queued after the call sees the mixed values). That is one
device-to-host and one host-to-device copy of the parameters per gossip
step; parameters on the CPU are averaged in place as before.
"""
import datetime
import re

import torch
import torch.distributed as dist

from . import _C, get_backend_group


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class GossipDataParallel(torch.nn.Module):
    """Gossip-averages ``module``'s parameters over the ranks of
    ``process_group`` (a gradcomm group; default: the world group).

    The training step::

        model = gradcomm.torch.GossipDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in data:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()       # local gradients: nothing is averaged in backward
            opt.step()            # local update
            model.gossip_step()   # push a share to this step's peer, mix what arrived
        model.synchronize()       # exact average over the ranks (before evaluation)

    Construction is collective: the parameters that require gradients
    (float32; on the CPU and contiguous, or on CUDA devices, staged through
    pinned host copies; anything else is a ValueError on every rank) are
    registered with the averager, then parameters and buffers are
    broadcast from rank 0, as torch's DDP does.

    ``gossip_step()`` writes the mixed (de-biased) values into the
    parameters' own storage, the same memory the optimizer updates; the
    optimizer's references (and its state, e.g. momentum) stay valid. Call
    it after ``opt.step()`` and before the next forward: autograd does not
    see this write. Do not replace ``param.data`` afterwards (an error).

    Buffers (e.g. BatchNorm statistics) stay local between
    ``synchronize()`` calls, which average the floating-point ones.

    Options (0 takes the GRADCOMM_GOSSIP_* parameter): ``peers_per_step``
    (GRADCOMM_GOSSIP_PEERS, 1), ``max_staleness`` in steps
    (GRADCOMM_GOSSIP_MAX_STALENESS, 16), ``peer_timeout`` in seconds or a
    timedelta (GRADCOMM_GOSSIP_PEER_TIMEOUT, 10 s), ``consensus_distance``
    (measure it every step: two blocking allreduces, diagnostics only),
    ``timeline_path`` (a Chrome trace of the gossip steps).
    """

    def __init__(self, module, process_group=None, peers_per_step=0, max_staleness=0, peer_timeout=0.0,
                 consensus_distance=False, timeline_path=""):
        super().__init__()
        self.module = module
        self.process_group = process_group
        pg = get_backend_group(process_group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        # CUDA parameters: the averager mixes pinned host copies (it averages
        # host memory); (parameter, host copy) pairs, refreshed around each
        # gossip step. A device neither CPU nor CUDA is left to the averager,
        # whose collective check rejects it on every rank.
        self._staged = []
        registered = []
        for p in self._params:
            if p.device.type == "cuda":
                h = torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
                self._staged.append((p, h))
                registered.append(h)
            else:
                registered.append(p.detach())
        self._devices = sorted({p.device for p, _ in self._staged}, key=str)
        self._copied_back = {}  # device -> the stream of the last copies from the host copies
        try:
            # Collective: every rank checks its own parameters, then all agree.
            self._gossip = _C.GossipAverager(pg, registered, peers_per_step=peers_per_step,
                                             max_staleness=max_staleness, peer_timeout=_seconds(peer_timeout),
                                             consensus_distance=consensus_distance, timeline_path=timeline_path)
        except ValueError as e:
            msg = re.sub(r"tensor (\d+)", lambda m: f"parameter '{self._names[int(m.group(1))]}'", str(e))
            msg = msg.replace("no tensors to average", "the module has no parameters that require gradients")
            msg = msg.replace("gradcomm GossipAverager", "gradcomm.torch.GossipDataParallel")
            raise ValueError(msg) from None
        self._pointers = [p.data_ptr() for p in self._params]
        # In place, so the averager's registered memory is what rank 0 sent.
        with torch.no_grad():
            works = [dist.broadcast(t, src=0, group=process_group, async_op=True)
                     for t in module.state_dict().values()]
            for w in works:
                w.wait()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _check_storage(self, what):
        for name, p, ptr in zip(self._names, self._params, self._pointers):
            if p.data_ptr() != ptr:
                raise RuntimeError(f"gradcomm.torch.GossipDataParallel.{what}: parameter '{name}' no longer has the "
                                   "storage it was registered with (param.data was replaced or resized); update "
                                   "parameters in place, or wrap the module again")

    def _to_host(self):
        """The CUDA parameters' current values in their host copies (the
        copies queued on each device's current stream, then waited for)."""
        if not self._staged:
            return
        for d, last in self._copied_back.items():
            # The copies back read the host copies on `last`: overwrite them after.
            if last != torch.cuda.current_stream(d):
                torch.cuda.current_stream(d).wait_stream(last)
        with torch.no_grad():
            for p, h in self._staged:
                h.copy_(p.detach(), non_blocking=True)
            for d in self._devices:
                torch.cuda.current_stream(d).synchronize()

    def _to_device(self):
        """The mixed values back into the CUDA parameters, queued on the
        current stream. The host copies are next written after _to_host's
        wait, on a stream ordered after these copies."""
        with torch.no_grad():
            for p, h in self._staged:
                p.detach().copy_(h, non_blocking=True)
        self._copied_back = {d: torch.cuda.current_stream(d) for d in self._devices}

    def gossip_step(self):
        """Pushes a share of the parameters to this step's peer(s), mixes the
        pushes that arrived, and leaves the de-biased parameters in place.
        Never waits for a peer. A slow rank's gossip clock skips ahead, so
        ranks may call it different numbers of times; to train for N steps,
        stop when stats()["clock"] reaches N (a rank that stops early looks
        dead to the others after the peer timeout)."""
        self._check_storage("gossip_step")
        self._to_host()
        self._gossip.step()
        self._to_device()

    def synchronize(self):
        """Makes the parameters the exact average over all ranks (an
        allreduce of all parameters, as costly as one DDP step's gradient
        averaging) and averages the floating-point buffers; collective.
        Pushes still in flight are dropped. Raises RuntimeError naming
        them when peers were removed from the gossip graph."""
        self._check_storage("synchronize")
        self._to_host()
        self._gossip.synchronize()
        self._to_device()
        buffers = [b for b in self.module.buffers() if b.is_floating_point()]
        if buffers:
            world = dist.get_world_size(self.process_group)
            with torch.no_grad():
                works = [dist.all_reduce(b, group=self.process_group, async_op=True) for b in buffers]
                for w, b in zip(works, buffers):
                    w.wait()
                    b.div_(world)

    def weight(self):
        """This rank's push-sum weight (1 at the start and after synchronize())."""
        return self._gossip.weight()

    def stats(self):
        """Counters since construction: steps, clock, sent, received, late, dropped,
        failed, isolated_steps, weight, consensus_distance (-1: not
        measured), removed_peers."""
        return self._gossip.stats()
