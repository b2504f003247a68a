"""gradcomm.torch: the torch.distributed backend, each test a multi-process job."""
import json
import os
import subprocess

import pytest

from harness import HERE, assert_all_ok, base_env, require_cuda, run_job, torchrun


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_dtype_op_and_layout_matches_gloo(tmp_path, world):
    results = assert_all_ok(run_job("collectives", world, tmp_path, timeout=150))
    checked = {r.result["checked"] for r in results}
    assert len(checked) == 1 and checked.pop() >= 400


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_allgather_and_reduce_scatter_match_gloo_and_shutdown_ends_the_group(tmp_path, world):
    results = assert_all_ok(run_job("coalesced", world, tmp_path, timeout=120))
    for r in results:
        assert "shut down" in r.result["after_shutdown"], r.result


@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_new_groups_are_subgroups_with_their_own_ranks_and_no_new_threads(tmp_path, mode):
    results = assert_all_ok(run_job("groups", 3, tmp_path, timeout=120, env={"GRADCOMM_TORCH_GROUPS": mode}))
    for r in results:
        grew = r.result["threads_after"] - r.result["threads_before"]
        if mode == "shared":
            assert grew == 0, r.result
        else:  # a communicator (and its progress and completion threads) per group
            assert grew >= 50, r.result


@pytest.mark.parametrize("init", ["file", "tcp"])
def test_init_process_group_through_init_method_takes_its_timeout(tmp_path, init):
    results = assert_all_ok(run_job("init", 2, tmp_path, init=init))
    assert [r.result["rank"] for r in results] == [0, 1]
    assert all(r.result["transport"] for r in results)


def test_init_process_group_under_torchrun(tmp_path):
    cmd = torchrun(tmp_path, os.path.join(HERE, "workers.py"), "init", "0", "0", "env://", str(tmp_path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env(), cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in (p.stdout + p.stderr).splitlines()
             if "RESULT " in line]
    assert sorted(r["rank"] for r in found) == [0, 1], found
    assert all(r["world"] == 2 for r in found)


def test_ddp_training_gives_the_same_parameters_as_gloo(tmp_path):
    results = assert_all_ok(run_job("ddp", 2, tmp_path, timeout=120))
    for r in results:
        assert r.result["max_param_diff"] <= 1e-6, r.result


@pytest.mark.parametrize("kind", ["shape", "dtype", "unsupported-dtype"])
def test_mismatched_tensors_fail_on_every_rank(tmp_path, kind):
    results = assert_all_ok(run_job("mismatch", 2, tmp_path, timeout=90, args=[kind]))
    for r in results:
        if kind == "unsupported-dtype" and r.rank == 0:
            # Rank 1's call was rejected before it issued anything and rank 1
            # then stops: rank 0's allreduce ends at the group's 30 s timeout
            # (a bounded wait, as with Gloo), naming the likely cause.
            assert r.result["seconds"] < 45, r.result
            assert "same calls" in r.result["error"] or "exited" in r.result["error"], r.result
            continue
        assert r.result["seconds"] < 15, r.result  # at once, not after the 30 s timeout
        msg = r.result["error"]
        assert "allreduce" in msg, msg
        if kind == "unsupported-dtype" and r.rank == 1:
            assert "Short" in msg, msg  # the rank that passed it says why
        else:
            assert "differ" in msg or "mismatch" in msg.lower() or "rank" in msg, msg


def test_tensors_neither_cpu_nor_cuda_are_a_clear_error(tmp_path):
    results = assert_all_ok(run_job("device", 2, tmp_path, timeout=60))
    for r in results:
        if r.result["cuda"] is not None:  # no GPU here (with a GPU the scenario makes its CUDA tensor)
            assert "CUDA" in r.result["cuda"] or "NVIDIA" in r.result["cuda"], r.result
        assert r.result["dispatcher_calls"] == 0, r.result
        assert "meta" in r.result["meta"] and "CPU and CUDA tensors" in r.result["meta"], r.result


def test_backend_is_registered_for_cuda_and_rejects_calls_mixing_devices(tmp_path):
    """Without a GPU: the registration, and the one-device-per-call check
    (CPU with meta tensors) through the backend's own entry points."""
    results = assert_all_ok(run_job("devices", 2, tmp_path, timeout=60))
    for r in results:
        res = r.result
        assert res["capability"] == res["devices"], res
        if res["torch_cuda"] and res["cuda_supported"]:
            # torch 2.x dispatches a CUDA tensor to the backend registered
            # for "cuda": the same gradcomm backend object as for "cpu".
            assert res["capability"] == ["cpu", "cuda"], res
            assert res["cuda_backend_is_ours"], res
        else:
            assert res["capability"] == ["cpu"], res
        assert len(res["mixed"]) == 6, res
        for name, msg in res["mixed"].items():
            assert msg is not None, f"{name} of CPU and meta tensors was not rejected"
            assert "different devices" in msg and "cpu" in msg and "meta" in msg, (name, msg)
            assert "nothing was issued" in msg, (name, msg)
        assert "meta" in res["all_meta"] and "CPU and CUDA tensors" in res["all_meta"], res
        assert "different devices" not in res["all_meta"], res
        assert res["usable_after"], res


def test_cuda_tensors_every_collective_stream_order_future_and_ddp(tmp_path):
    """Needs a GPU. scripts/gpu-check sets GRADCOMM_REQUIRE_CUDA=1, where a
    skip is a failure."""
    require_cuda("CUDA tensors")
    results = assert_all_ok(run_job("cuda", 2, tmp_path, timeout=300))
    for r in results:
        res = r.result
        assert res["checked"] >= 40, res
        msg = res["errors"]["cpu_and_cuda"]
        assert msg is not None and "different devices" in msg and "cpu" in msg and "cuda" in msg, res
        if res["devices"] >= 2:
            msg = res["errors"]["two_cuda_devices"]
            assert msg is not None and "same CUDA device" in msg, res


def test_distributed_data_parallel_on_a_cuda_model_matches_gloo_on_any_stream(tmp_path):
    """Needs a GPU (a failure instead of a skip under GRADCOMM_REQUIRE_CUDA=1)."""
    require_cuda("DistributedDataParallel on CUDA")
    results = assert_all_ok(run_job("cuda_wrappers", 2, tmp_path, timeout=300))
    for r in results:
        res = r.result
        # The worker checks allclose (rtol 1e-4, atol 1e-5) per parameter: GPU against CPU arithmetic.
        assert res["max_param_diff_default"] <= 1e-4 and res["max_param_diff_side"] <= 1e-4, res
        assert res["buckets_default"] >= 2, res  # several allreduces overlapped with backward


def test_wrappers_reject_parameters_on_several_devices_or_unsupported_ones(tmp_path):
    results = assert_all_ok(run_job("wrapper_devices", 2, tmp_path, timeout=60))
    for r in results:
        e = r.result["errors"]
        msg = e["ddp_cpu_and_meta"]
        assert msg and msg.startswith("ValueError") and "'b'" in msg and "meta" in msg, e
        assert "DistributedDataParallel" in msg and "CPU or on one CUDA device" in msg, e
        msg = e["ddp_all_meta"]
        assert msg and msg.startswith("ValueError") and "'0.weight'" in msg and "meta" in msg, e
        msg = e["gossip_cpu_and_meta"]
        assert msg and msg.startswith("ValueError") and "GossipDataParallel" in msg, e
        assert "parameter 'b' is on meta" in msg, e
        msg = e["reducer_cpu_and_meta"]
        assert msg and "parameter 1 is on meta" in msg, e
        msg = e["cpu_and_cuda"]
        assert msg and "2 devices" in msg and "cpu: 'w'" in msg and "cuda:0: 'v'" in msg, e
        msg = e["two_cuda"]
        assert msg and "cuda:0: 'w'" in msg and "cuda:1: 'v', 'u'" in msg and "one device" in msg, e
        assert r.result["one"] == "cpu", r.result


def test_unsupported_ops_name_what_to_use(tmp_path):
    results = assert_all_ok(run_job("unsupported", 2, tmp_path, timeout=60))
    for r in results:
        for op in ("recv_anysource", "all_to_all"):
            assert "not supported" in r.result[op] and "gloo" in r.result[op], r.result[op]
        assert "src=" in r.result["recv_anysource"], r.result["recv_anysource"]
        assert "BXOR" in r.result["BXOR"], r.result["BXOR"]
        assert "stays usable" in r.result["BXOR"], r.result["BXOR"]
        assert r.result["usable_after_rejection"], r.result
        m = r.result
        assert "output list has 3 tensors; it needs one per rank (2)" in m["allgather_list"], m
        assert "output tensor Float[3] does not match the input Float[2]" in m["allgather_shape"], m
        assert "the output Float[3] must hold world_size (2) times the input Float[2]" in m["allgather_base"], m
        assert "input tensor Float[3] does not match the output Float[2]" in m["reduce_scatter_shape"], m
        assert "the input Float[3] must hold world_size (2) times the output Float[2]" in m["reduce_scatter_base"], m
        assert m["usable_after_bad_lists"], m


def test_a_call_one_rank_rejects_fails_every_rank_at_its_next_call(tmp_path):
    results = assert_all_ok(run_job("reject_one_rank", 2, tmp_path, timeout=90))
    for r in results:
        assert r.result["seconds"] < 20, r.result  # the call check, not the 30 s timeout
    one = results[1].result
    assert "Short" in one["first"] and "stays usable" in one["first"], one
    for r in results:
        msg = r.result["error"].lower()
        assert "mismatch" in msg or "differ" in msg, r.result


@pytest.mark.parametrize("world", [2, 3])
def test_send_recv_give_gloos_results_for_every_dtype_layout_and_tag(tmp_path, world):
    results = assert_all_ok(run_job("p2p", world, tmp_path, timeout=150))
    checked = {r.result["checked"] for r in results}
    # 11 dtypes x 2 modes x 4 layouts, 4 tagged, 1 large, 3 around collectives, 1 batch, 1 reply, 1 star
    assert checked == {11 * 2 * 4 + 4 + 1 + 3 + 1 + 1 + 1}, results


@pytest.mark.parametrize("kind", ["count", "count-larger", "dtype", "peer", "self", "tag"])
def test_send_recv_mismatch_or_bad_peer_fails_on_both_ranks(tmp_path, kind):
    results = assert_all_ok(run_job("p2p_bad", 2, tmp_path, timeout=60, args=[kind]))
    for r in results:
        msg = r.result["error"]
        assert r.result["seconds"] < 15, r.result  # at once, not after the 30 s timeout
        if kind.startswith("count") or kind == "dtype":
            assert "same dtype and number of elements" in msg, msg
            assert "rank 0 sent 8 elements of float32" in msg or kind == "dtype", msg
        elif r.rank == 0:
            want = {"peer": "destination rank 5 is not in [0, 2)", "self": "this rank itself",
                    "tag": "tag 100 is not in [0, 7]"}[kind]
            assert want in msg, msg
        else:
            assert "rank 0" in msg, msg  # the receiver is told who failed
        if r.rank == 1 and r.result["recv"] is not None:
            assert not any(r.result["recv"]), r.result  # no data landed


def test_a_rank_that_dies_makes_the_others_raise_within_the_timeout(tmp_path):
    results = run_job("dead_rank", 3, tmp_path, timeout=90)
    assert results[-1].returncode == 17, results[-1]
    for r in results[:-1]:
        assert r.returncode == 0, r
        assert r.result["step"] == 5, r.result
        assert r.result["seconds"] < r.result["timeout"] + 5, r.result


def test_wrong_world_size_is_a_timeout_naming_the_rendezvous(tmp_path):
    # world_size 3, but only ranks 0 and 1 start
    results = assert_all_ok(run_job("wrong_world", 3, tmp_path, ranks=[0, 1], timeout=60))
    for r in results:
        msg = r.result["error"]
        assert "rendezvous" in msg and "file://" in msg, msg
        assert "rank 2" in msg, msg
        assert r.result["seconds"] < 30, r.result


def test_timeline_and_stats_through_the_backend(tmp_path):
    trace = tmp_path / "trace.json"
    results = assert_all_ok(run_job("telemetry", 2, tmp_path, env={"GRADCOMM_TIMELINE": str(trace),
                                                                    "GRADCOMM_STATS": "1"}))
    for r in results:
        path = tmp_path / f"trace.rank{r.rank}.json"
        events = json.loads(path.read_text())["traceEvents"]
        spans = [e for e in events if e.get("name") == "allreduce" and e.get("ph") == "X"]
        assert len(spans) == 4, events
        assert all(e["args"]["bytes"] == 4000 for e in spans), spans
        if r.rank == 0:  # GRADCOMM_STATS prints on rank 0 (GRADCOMM_STATS_ALL_RANKS=1: on every rank)
            assert "allreduce" in r.stderr and "calls        4" in r.stderr, r.stderr
        else:
            assert "calls        4" not in r.stderr, r.stderr


def test_compression_hooks_with_error_feedback_converge_like_uncompressed_training(tmp_path):
    results = assert_all_ok(run_job("hooks", 2, tmp_path, timeout=150))
    for r in results:
        losses = r.result["losses"]
        assert losses["none"] < losses["initial"] / 5, losses  # it learned: the comparison means something
        for name in ("fp16", "bf16", "topk"):
            assert abs(losses[name] - losses["none"]) <= 0.02 * losses["none"], losses


def test_example_script_runs_under_torchrun_with_a_hook(tmp_path):
    example = os.path.join(HERE, "..", "..", "examples", "pytorch_ddp.py")
    cmd = torchrun(tmp_path, example, "--steps", "5", "--hook", "topk:0.01")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env({"GRADCOMM_STATS": "1"}),
                       cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "backend gradcomm  mode ddp  hook topk:0.01  ranks 2" in out, out[-4000:]
    assert "allreduce[topk:0.01] calls        5" in out, out[-4000:]


def test_wrapper_gives_ddps_gradients_including_no_sync(tmp_path):
    results = assert_all_ok(run_job("wrapper", 2, tmp_path, timeout=120))
    for r in results:
        assert r.result["steps"] == 10 and r.result["buckets"] >= 2, r.result
        assert r.result["max_grad_diff"] <= 1e-6, r.result
        assert r.result["collected"], "the wrapper outlived its last reference (a cycle through its hooks)"


@pytest.mark.parametrize("script,args", [
    ("torch_collectives.py", ["--max-bytes", "16K", "--iters", "2"]),
    ("torch_ddp.py", ["--width", "32", "--depth", "1", "--steps", "2", "--warmup", "1"]),
])
def test_benchmark_scripts_write_their_json_rows(tmp_path, script, args):
    out = tmp_path / "rows.json"
    cmd = torchrun(tmp_path, os.path.join(HERE, "..", "..", "bench", script), *args, "--json", str(out))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env(), cwd=str(tmp_path))
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = json.loads(out.read_text())["results"]
    assert {r["backend"] for r in rows} == {"gloo", "gradcomm"}, rows
    if script == "torch_ddp.py":
        assert {r["mode"] for r in rows} == {"ddp", "ddp+fp16", "ddp+topk", "reducer"}, rows
        assert all(r["step_ms"] > 0 and 0 < r["utilization"] <= 1 for r in rows), rows
        # same model, data and start: the exact modes end with the same loss
        exact = {r["final_loss"] for r in rows if r["mode"] in ("ddp", "reducer")}
        assert len(exact) == 1, rows
    else:
        assert all(r["bytes"] > 0 and r["time_us"] > 0 for r in rows), rows
