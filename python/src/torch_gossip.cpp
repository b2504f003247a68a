#include "torch_gossip.hpp"

#include <stdexcept>

#include "gradcomm/error.hpp"

namespace gradcomm::torch_backend {

std::string gossipTensorProblem(size_t i, const at::Tensor& t) {
  const std::string which = "tensor " + std::to_string(i);
  if (!t.defined()) return which + " is undefined";
  if (!t.device().is_cpu()) {
    return which + " is on " + t.device().str() +
           "; the gossip averager averages host memory: CPU tensors (GossipDataParallel stages CUDA parameters "
           "through host copies; other devices are not supported)";
  }
  if (t.layout() != at::kStrided) return which + " is not a dense (strided) tensor";
  if (t.scalar_type() != at::kFloat) {
    return which + " has dtype " + std::string(c10::toString(t.scalar_type())) +
           "; the gossip averager takes float32 tensors only";
  }
  if (!t.is_contiguous()) return which + " is not contiguous; the gossip averager averages contiguous memory";
  return "";
}

namespace {

// Local checks of the options (the C++ averager would abort the whole
// communicator on some of these; here they are plain errors).
std::string optionProblem(const TorchGossipOptions& o) {
  if (o.peersPerStep < 0 || o.peersPerStep > 64) {
    return "peers_per_step must be in [0, 64] (0: GRADCOMM_GOSSIP_PEERS), got " + std::to_string(o.peersPerStep);
  }
  if (o.maxStaleness < 0 || o.maxStaleness > 1000) {
    return "max_staleness must be in [0, 1000] steps (0: GRADCOMM_GOSSIP_MAX_STALENESS), got " +
           std::to_string(o.maxStaleness);
  }
  if (!(o.peerTimeoutS >= 0) || o.peerTimeoutS > 86400) {
    return "peer_timeout must be in [0, 86400] seconds (0: GRADCOMM_GOSSIP_PEER_TIMEOUT), got " +
           std::to_string(o.peerTimeoutS);
  }
  return "";
}

GossipOptions convert(const TorchGossipOptions& o) {
  GossipOptions g;
  g.peersPerStep = static_cast<size_t>(o.peersPerStep);
  g.maxStaleness = static_cast<int>(o.maxStaleness);
  g.peerTimeout = std::chrono::milliseconds(static_cast<int64_t>(o.peerTimeoutS * 1e3));
  g.consensusDistance = o.consensusDistance;
  g.timelinePath = o.timelinePath;
  return g;
}

}  // namespace

TorchGossip::TorchGossip(const c10::intrusive_ptr<ProcessGroupGradcomm>& pg, std::vector<at::Tensor> tensors,
                         const TorchGossipOptions& options)
    : pg_(pg), tensors_(std::move(tensors)) {
  std::string problem = optionProblem(options);
  if (problem.empty() && tensors_.empty()) problem = "no tensors to average";
  for (size_t i = 0; problem.empty() && i < tensors_.size(); ++i) problem = gossipTensorProblem(i, tensors_[i]);
  // Agree before anything else is collective: which ranks (if any) rejected
  // their input. Every rank takes part, so none waits for a rank that threw.
  Communicator comm = pg_->communicator();
  const int64_t size = comm.size();
  int64_t mine[2] = {problem.empty() ? 0 : 1, problem.empty() ? size : comm.rank()};
  int64_t agreed[2] = {0, 0};
  comm.allreduce(&mine[0], &agreed[0], 1, DataType::kInt64, ReduceOp::kSum).wait();
  comm.allreduce(&mine[1], &agreed[1], 1, DataType::kInt64, ReduceOp::kMin).wait();
  if (!problem.empty()) throw std::invalid_argument("gradcomm GossipAverager: " + problem);
  if (agreed[0] > 0) {
    throw std::invalid_argument("gradcomm GossipAverager: rank " + std::to_string(agreed[1]) +
                                (agreed[0] > 1 ? " (and " + std::to_string(agreed[0] - 1) + " other rank(s))" : "") +
                                " rejected its tensors or options (its error says why); no averager was made");
  }
  std::vector<GossipBuffer> buffers;
  for (auto& t : tensors_) {
    buffers.push_back({t.data_ptr<float>(), static_cast<size_t>(t.numel())});
    pointers_.push_back(t.data_ptr());
    numel_ += static_cast<size_t>(t.numel());
  }
  averager_ = std::make_unique<GossipAverager>(std::move(comm), std::move(buffers), convert(options));
}

void TorchGossip::checkStorage(const char* what, bool collective) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    // resize_()/set_() on the registered tensor would leave the averager
    // writing freed memory: refuse instead.
    if (tensors_[i].data_ptr() == pointers_[i]) continue;
    InvalidUsage e(std::string("gradcomm GossipAverager.") + what + ": tensor " + std::to_string(i) +
                   " no longer has the storage it was registered with (resized or replaced); make a new averager");
    // In a collective the other ranks would wait for this one: abort the
    // communicator so they fail too.
    if (collective) pg_->communicator().abort(std::string("could not synchronize its GossipAverager: ") + e.what());
    throw e;
  }
}

void TorchGossip::step() {
  checkStorage("step", false);
  averager_->step();
}

void TorchGossip::synchronize() {
  checkStorage("synchronize", true);
  averager_->synchronize();
}

}  // namespace gradcomm::torch_backend
