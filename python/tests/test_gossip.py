"""gradcomm.torch.GossipAverager and GossipDataParallel, each test a multi-process job."""
import os
import subprocess

import pytest

from harness import HERE, assert_all_ok, base_env, require_cuda, run_job, torchrun


def test_gossip_averager_reaches_consensus_and_synchronize_gives_the_exact_mean(tmp_path):
    results = assert_all_ok(run_job("gossip_average", 3, tmp_path, timeout=90))
    for r in results:
        res = r.result
        d = res["distances"]
        # Push-sum contracts the distance from the mean geometrically (about 2x a step on 3 ranks,
        # not monotonically: a step in which nothing has arrived yet mixes nothing); float32
        # rounding leaves ~1e-5 of an initial ~300.
        assert d[9] < res["dist0"] / 10, d
        assert d[-1] < 1e-4 * res["dist0"], d
        # Nothing dropped (staleness bound 16, ranks in step), so the de-biased values approach the
        # mean of the initial values, not merely some consensus.
        assert res["stats"]["dropped"] == 0, res["stats"]
        assert res["worst_from_mean0"] < 1e-4 * res["spread0"], res
        # synchronize(): the exact mean of what the ranks held (float32 average vs. float64 mean), bitwise
        # the same on every rank (checked in the worker); weight back to 1.
        assert res["sync_err"] <= 1e-5 * res["scale"], res
        assert res["weight_after"] == 1.0
        st = res["stats"]
        assert st["steps"] == 30 and st["sent"] == 30, st  # one peer per step (GRADCOMM_GOSSIP_PEERS=1)
        assert st["received"] > 0 and st["failed"] == 0 and st["removed_peers"] == [], st
    assert {r.result["sync_err"] for r in results} == {results[0].result["sync_err"]}


def test_gossip_data_parallel_sgd_reaches_the_loss_of_allreduce_sgd(tmp_path):
    results = assert_all_ok(run_job("gossip_train", 3, tmp_path, timeout=180))
    for r in results:
        res = r.result
        initial, ar, gossip, local = res["initial"], res["allreduce"], res["gossip"], res["local_then_average"]
        assert ar < initial / 10, res  # the problem is learned: the comparison means something
        # SGP's averaged model follows the averaged-gradient dynamics up to a consensus error that
        # shrinks geometrically each step, plus the error of pushes mixed a few steps late. With the
        # caller's update on the push-sum numerator (z += (p - z) / w), a rank whose incoming pushes
        # are late has a small weight and takes a larger step, so lateness moves the result both
        # ways. One training's gossip / allreduce (lr 0.05, 200 steps) was 0.86-0.96 idle; beside
        # 2 busy loops 0.86-1.07 in 37 of 39 trainings, 1.32 and 2.35 in the other two, and 2.56 in
        # one of 8 at an earlier build (also 1.76 once in a whole-suite run). The late trainings'
        # counts of late pushes and their push-sum weights (all >= 0.29) were like the others';
        # the cause is not found. So the job runs three trainings and bounds their median; the
        # control below (2.9x) is what mixing must close.
        assert len(gossip) == 3, res
        median = sorted(gossip)[1]
        assert 0.75 * ar <= median <= 1.6 * ar, res
        # The control: the same local steps with no mixing, averaged once at the end, is far worse
        # on this non-iid data (measured 2.9x), so the mixing is what closes the gap.
        assert local > 2 * ar, res
        for st in res["stats"]:
            assert st["steps"] == 200 and st["sent"] == 200 and st["received"] > 100 and st["failed"] == 0, st


@pytest.mark.parametrize("kind", ["dtype", "noncontiguous", "device", "sizes", "option", "empty", "wrapper-dtype"])
def test_bad_gossip_input_is_an_error_on_every_rank_and_the_group_stays_usable(tmp_path, kind):
    results = assert_all_ok(run_job("gossip_bad", 2, tmp_path, timeout=60, args=[kind]))
    for r in results:
        msg = r.result["error"]
        assert r.result["seconds"] < 15, r.result  # at once, not after the 30 s timeout
        if kind == "sizes":
            assert msg.startswith("RuntimeError") and "different parameter sizes" in msg, msg
            continue
        assert msg.startswith("ValueError"), msg
        if kind == "empty":
            assert "no tensors to average" in msg, msg
            continue
        bad_rank = 0 if kind == "option" else 1
        if r.rank != bad_rank:
            assert f"rank {bad_rank} rejected its tensors or options" in msg, msg
            continue
        want = {"dtype": "tensor 1 has dtype Double", "noncontiguous": "tensor 1 is not contiguous",
                "device": "tensor 0 is on meta", "option": "max_staleness must be in [0, 1000]",
                "wrapper-dtype": "parameter '0.weight' has dtype Double"}[kind]
        assert want in msg, msg
        if kind == "wrapper-dtype":
            assert "GossipDataParallel" in msg, msg


def test_gossip_data_parallel_on_a_cuda_model_synchronizes_mixes_and_trains(tmp_path):
    """Needs a GPU (a failure instead of a skip under GRADCOMM_REQUIRE_CUDA=1)."""
    require_cuda("GossipDataParallel on CUDA")
    results = assert_all_ok(run_job("gossip_cuda", 2, tmp_path, timeout=300))
    for r in results:
        res = r.result
        assert res["moved"] and res["received"] > 0, res
        # On the CPU, 200 such steps reach under a tenth of the initial loss (test above);
        # pushes mixed late cost up to ~2.4x of that, hence the margin.
        assert res["end_loss"] < res["start_loss"] / 3, res


@pytest.mark.parametrize("kind", ["moved", "wrapper-moved"])
def test_gossip_refuses_tensors_whose_storage_moved(tmp_path, kind):
    results = assert_all_ok(run_job("gossip_bad", 2, tmp_path, timeout=60, args=[kind]))
    for r in results:
        msg = r.result["error"]
        assert msg.startswith("RuntimeError") and "no longer has the storage it was registered with" in msg, msg
        if kind == "wrapper-moved":
            assert "parameter '0.weight'" in msg, msg


def test_example_script_runs_in_gossip_mode_under_torchrun(tmp_path):
    example = os.path.join(HERE, "..", "..", "examples", "pytorch_ddp.py")
    cmd = torchrun(tmp_path, example, "--steps", "5", "--mode", "gossip")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env(), cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "backend gradcomm  mode gossip  hook none  ranks 2" in out, out[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: gossip sent 5  mixed " in out, out[-4000:]
