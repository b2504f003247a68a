// gradcomm.torch._C: the ProcessGroupGradcomm class (a subclass of
// torch.distributed's Backend), gradcomm's ErrorFeedback, the Reducer
// and the GossipAverager over tensors.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "gradcomm/communicator.hpp"
#include "gradcomm/version.hpp"
#include "device.hpp"
#include "process_group.hpp"
#include "torch_gossip.hpp"
#include "torch_reducer.hpp"

namespace py = pybind11;
using gradcomm::torch_backend::ProcessGroupGradcomm;
using gradcomm::torch_backend::TorchGossip;
using gradcomm::torch_backend::TorchReducer;

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradcomm's c10d backend for PyTorch 2.x (CPU and CUDA tensors)";
  // ProcessGroup, Work and Store are registered by torch's own extension;
  // import it first so this module can refer to them.
  py::module_::import("torch.distributed");

  py::class_<gradcomm::ErrorFeedback, std::shared_ptr<gradcomm::ErrorFeedback>>(
      m, "ErrorFeedback", "What compression has not sent yet of one tensor, added to its next allreduce.")
      .def(py::init<>())
      .def("clear", &gradcomm::ErrorFeedback::clear, "Forgets the carried error.")
      .def("size", &gradcomm::ErrorFeedback::size, "Elements carried (0 before first use).");

  py::class_<ProcessGroupGradcomm, c10d::Backend, c10::intrusive_ptr<ProcessGroupGradcomm>>(
      m, "ProcessGroupGradcomm", "torch.distributed backend running gradcomm collectives on CPU and CUDA tensors.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             // Forming the communicator waits for every rank: let other
             // Python threads run meanwhile.
             py::gil_scoped_release release;
             return c10::make_intrusive<ProcessGroupGradcomm>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      .def("subgroup", &ProcessGroupGradcomm::subgroup, py::arg("ranks"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(),
           "The group of `ranks` (this group's ranks, in the new group's order) over this group's context, "
           "formed by those ranks alone: no new connections or threads.")
      .def("allreduce_compressed", &ProcessGroupGradcomm::allreduceCompressed, py::arg("tensor"),
           py::arg("compression"), py::arg("error_feedback") = nullptr,
           py::call_guard<py::gil_scoped_release>(),
           "Averages a tensor with gradcomm's compression ('fp16', 'bf16', 'topk:0.01', ...); error feedback, when "
           "the compression asks for it, lives in error_feedback (one ErrorFeedback per tensor, kept by the caller; "
           "None: none for this call). Returns a Work whose future holds [tensor].")
      .def("stats",
           [](const ProcessGroupGradcomm& pg) {
             py::dict out;
             for (const auto& [what, s] : pg.stats()) {
               py::dict d;
               d["calls"] = s.calls;
               d["bytes"] = s.bytes;
               d["comm_ms"] = s.commMs;
               out[py::str(what)] = d;
             }
             return out;
           },
           "Per collective: calls, bytes and summed running time (ms).")
      .def("exposed_ms", &ProcessGroupGradcomm::exposedMs, "Time callers were blocked in Work.wait (ms).")
      .def("transport", &ProcessGroupGradcomm::transportName)
      .def_property_readonly("timeout", &ProcessGroupGradcomm::timeout);

  py::class_<TorchReducer>(m, "Reducer", "gradcomm's Reducer over a model's parameters (DistributedDataParallel).")
      .def(py::init([](const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, const std::vector<at::Tensor>& params,
                       size_t bucketCapBytes, size_t firstBucketBytes, const std::string& compression) {
             gradcomm::ReducerOptions o;
             o.bucketCapBytes = bucketCapBytes;
             o.firstBucketBytes = firstBucketBytes;
             o.compression = compression;
             py::gil_scoped_release release;  // collective: checks every rank registered the same
             return std::make_unique<TorchReducer>(pg, params, o);
           }),
           py::arg("process_group"), py::arg("params"), py::arg("bucket_cap_bytes") = 0,
           py::arg("first_bucket_bytes") = 0, py::arg("compression") = "")
      .def("grad_ready", &TorchReducer::gradReady, py::call_guard<py::gil_scoped_release>())
      .def("mark_unused", &TorchReducer::markUnused, py::call_guard<py::gil_scoped_release>())
      .def("finalize", &TorchReducer::finalize, py::call_guard<py::gil_scoped_release>())
      .def("buckets", &TorchReducer::buckets)
      .def("__len__", &TorchReducer::size)
      .def_property_readonly(
          "device",
          [](const TorchReducer& r) -> py::object {
            if (auto d = r.device()) return py::str(d->str());
            return py::none();
          },
          "The parameters' CUDA device (\"cuda:N\"), or None for CPU parameters.")
      .def("last_step_stats", [](const TorchReducer& r) {
        const auto s = r.lastStepStats();
        py::dict d;
        d["step"] = s.step;
        d["step_ms"] = s.stepMs;
        d["comm_ms"] = s.commMs;
        d["exposed_ms"] = s.exposedMs;
        d["hidden_ms"] = s.hiddenMs;
        d["compute_ms"] = s.computeMs;
        d["utilization"] = s.utilization;
        d["buckets"] = s.buckets;
        d["bytes"] = s.bytes;
        return d;
      });

  py::class_<TorchGossip>(m, "GossipAverager",
                          "gradcomm's GossipAverager (push-sum gossip, SGP) over float32 CPU tensors, averaged in "
                          "place; keeps the tensors alive. Construction is collective.")
      .def(py::init([](const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, std::vector<at::Tensor> tensors,
                       int64_t peersPerStep, int64_t maxStaleness, double peerTimeout, bool consensusDistance,
                       const std::string& timelinePath) {
             gradcomm::torch_backend::TorchGossipOptions o{peersPerStep, maxStaleness, peerTimeout, consensusDistance,
                                                           timelinePath};
             py::gil_scoped_release release;  // collective: waits for every rank
             return std::make_unique<TorchGossip>(pg, std::move(tensors), o);
           }),
           py::arg("process_group"), py::arg("tensors"), py::arg("peers_per_step") = 0, py::arg("max_staleness") = 0,
           py::arg("peer_timeout") = 0.0, py::arg("consensus_distance") = false, py::arg("timeline_path") = "",
           "peers_per_step, max_staleness (steps) and peer_timeout (seconds): 0 takes GRADCOMM_GOSSIP_PEERS, "
           "GRADCOMM_GOSSIP_MAX_STALENESS and GRADCOMM_GOSSIP_PEER_TIMEOUT. consensus_distance: measure it every "
           "step (two blocking allreduces). timeline_path: Chrome trace of the steps (rank inserted).")
      .def("step", &TorchGossip::step, py::call_guard<py::gil_scoped_release>(),
           "Pushes this step's share to the step's peer(s), mixes what arrived, leaves the de-biased values in the "
           "tensors. Never waits for a peer.")
      .def("synchronize", &TorchGossip::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Exact average over all ranks (allreduce); collective. Weights reset to 1.")
      .def("weight", &TorchGossip::weight, "This rank's push-sum weight.")
      .def("numel", &TorchGossip::numel, "Float32 elements averaged.")
      .def("__len__", &TorchGossip::size)
      .def("stats",
           [](const TorchGossip& g) {
             const auto s = g.stats();
             py::dict d;
             d["steps"] = s.steps;
             d["clock"] = s.clock;
             d["sent"] = s.sent;
             d["received"] = s.received;
             d["late"] = s.late;
             d["dropped"] = s.dropped;
             d["failed"] = s.failed;
             d["isolated_steps"] = s.isolatedSteps;
             d["weight"] = s.weight;
             d["consensus_distance"] = s.consensusDistance;
             d["removed_peers"] = s.removedPeers;
             return d;
           },
           "Counters since construction: steps, clock, sent, received, late, dropped, failed, isolated_steps, weight, "
           "consensus_distance (-1: not measured), removed_peers.");

  m.attr("__version__") = GRADCOMM_VERSION_STRING;
  // Whether this build takes CUDA tensors (compiled against a torch whose
  // c10::Stream exposes the cudaStream_t); the backend registers for
  // "cuda" only then, and only on a torch built with CUDA.
  m.attr("cuda_supported") = gradcomm::torch_backend::cudaSupported();
}
