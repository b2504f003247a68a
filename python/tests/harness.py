"""Launches the ranks of one job as separate processes and collects what they did.

Each rank runs ``python3 workers.py SCENARIO RANK WORLD INIT_METHOD OUTDIR``;
a scenario raises (non-zero exit) when a check fails and may print
``RESULT <json>`` for the test to read. Everything is bounded in time: a job
that outlives its timeout is killed and reported as such.
"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("GRADCOMM_TEST_PYTHON", sys.executable)


def free_port():
    """A TCP port on 127.0.0.1 nobody listens on right now, below the
    kernel's ephemeral range (tests/free-port says why)."""
    spec = importlib.util.spec_from_loader(
        "free_port", importlib.machinery.SourceFileLoader("free_port", os.path.join(HERE, "..", "..", "tests", "free-port")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.free_port()


def torchrun(tmp_path, script, *args):
    """The command that runs `script` on 2 processes under torch's launcher
    (its logs under tmp_path, not a torchelastic_* folder left in /tmp)."""
    return [PYTHON, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--nproc_per_node", "2",
            "--log_dir", str(tmp_path / "torchrun-logs"), "--master_addr", "127.0.0.1", "--master_port",
            str(free_port()), script, *args]


class RankResult:
    def __init__(self, rank, returncode, stdout, stderr, seconds, killed):
        self.rank = rank
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds
        self.killed = killed

    @property
    def result(self):
        """The JSON the rank printed after 'RESULT ', or None."""
        for line in self.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        return None

    def __repr__(self):
        return (f"rank {self.rank}: exit {self.returncode}{' (killed: timeout)' if self.killed else ''} "
                f"after {self.seconds:.1f}s\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


def base_env(extra=None):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a crashing rank prints where it was
    env.setdefault("PYTHONWARNINGS", "ignore")
    if extra:
        env.update(extra)
    return env


def run_job(scenario, world, tmp_path, init="file", timeout=90, env=None, ranks=None, args=()):
    """Runs `scenario` on `world` ranks (or only those in `ranks`) and
    returns one RankResult per launched rank, in rank order."""
    if init == "file":
        init_method = f"file://{tmp_path}/store-{scenario}-{time.monotonic_ns()}"
    elif init == "tcp":
        init_method = f"tcp://127.0.0.1:{free_port()}"
    else:
        init_method = init
    ranks = list(range(world)) if ranks is None else ranks
    procs = []
    start = time.monotonic()
    for r in ranks:
        cmd = [PYTHON, os.path.join(HERE, "workers.py"), scenario, str(r), str(world), init_method, str(tmp_path),
               *map(str, args)]
        procs.append((r, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=base_env(env), cwd=str(tmp_path))))
    results = []
    for r, p in procs:
        left = max(1.0, timeout - (time.monotonic() - start))
        killed = False
        try:
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            killed = True
            for _, q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
        results.append(RankResult(r, p.returncode, out, err, time.monotonic() - start, killed))
    return results


def assert_all_ok(results):
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "\n".join(map(repr, results))
    return results


def cuda_here():
    """(usable, why not): a GPU torch can use, and an extension that takes CUDA tensors."""
    probe = ("import torch, gradcomm.torch as g; "
             "print(int(torch.cuda.is_available()), int(g.cuda_supported), torch.__version__, torch.version.cuda)")
    p = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=120, env=base_env())
    if p.returncode != 0:
        return False, "probing torch failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    available, supported, version, cuda = p.stdout.split()
    if available != "1":
        return False, f"torch.cuda.is_available() is false (torch {version}, CUDA {cuda}): no GPU here"
    if supported != "1":
        return False, f"this build of gradcomm.torch takes CPU tensors only (torch {version})"
    return True, ""


def require_cuda(what):
    """Skips the calling test without a usable GPU; with
    GRADCOMM_REQUIRE_CUDA=1 (scripts/gpu-check) fails it instead."""
    import pytest
    usable, why = cuda_here()
    if not usable:
        if os.environ.get("GRADCOMM_REQUIRE_CUDA") == "1":
            pytest.fail(f"GRADCOMM_REQUIRE_CUDA=1 but {what} cannot be tested: {why}")
        pytest.skip(f"{what} not tested: {why}")
