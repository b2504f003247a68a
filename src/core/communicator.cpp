#include <cstring>

#include "algorithms/catalog.hpp"
#include "compression/compression.hpp"
#include "core/communicator_impl.hpp"
#include "core/device_staging.hpp"
#include "base/algo_rules.hpp"
#include "base/units.hpp"
#include "topology/calibration.hpp"
#include "topology/tuning_file.hpp"

namespace gradcomm {

using algorithms::CollectiveCall;
using detail::Clock;

// ---- Work ----------------------------------------------------------------------

namespace {

/// Runs a device query of a finished call's device part; a device error
/// fails the context on every rank (the others learn it as a RemoteError)
/// and is rethrown here.
template <typename F>
auto onDevicePart(detail::OperationState& op, F&& f) -> decltype(f(*op.deviceDone)) {
  try {
    return f(*op.deviceDone);
  } catch (const Error& e) {
    if (auto engine = op.engine.lock()) engine->abort(e.code(), op.describe() + ": " + e.what(), true);
    throw;
  }
}

/// Waits for the host part of `op` until `deadline`; rethrows its error.
bool waitHostPart(detail::OperationState& op, Clock::time_point deadline) {
  if (!op.finished()) {
    if (auto engine = op.engine.lock()) engine->waitFor(op, deadline);
  }
  op.rethrowIfFailed();
  return op.finished();
}

}  // namespace

bool Work::test() {
  if (!state_) return true;
  if (!waitHostPart(*state_, Clock::now() + std::chrono::microseconds(1))) return false;
  return !state_->deviceDone || onDevicePart(*state_, [](detail::DeviceCompletion& d) { return d.done(); });
}

void Work::wait() {
  if (!state_) return;
  waitHostPart(*state_, Clock::time_point::max());
  if (state_->deviceDone) onDevicePart(*state_, [](detail::DeviceCompletion& d) { d.wait(); });
}

bool Work::wait(std::chrono::milliseconds timeout) {
  if (!state_) return true;
  if (!waitHostPart(*state_, Clock::now() + timeout)) return false;
  // The device part left after the host part is short: waited for whole.
  if (state_->deviceDone) onDevicePart(*state_, [](detail::DeviceCompletion& d) { d.wait(); });
  return true;
}

void Work::synchronize(void* stream) {
  if (!state_ || !state_->deviceDone) return wait();
  waitHostPart(*state_, Clock::time_point::max());
  onDevicePart(*state_, [stream](detail::DeviceCompletion& d) { d.streamWait(stream); });
}

bool Work::onDevice() const { return state_ && state_->deviceDone; }

std::string Work::algorithm() const {
  if (state_) return state_->algorithmName();
  return done_.algorithm ? done_.algorithm : std::string();
}

uint64_t Work::sequence() const { return state_ ? state_->seq : done_.seq; }

std::chrono::steady_clock::time_point Work::startTime() const {
  if (!state_) return done_.start;
  return state_->status.load() >= detail::OperationState::kRunning ? state_->startedAt
                                                                   : std::chrono::steady_clock::time_point{};
}

std::chrono::steady_clock::time_point Work::endTime() const {
  if (!state_) return done_.end;
  return state_->finished() ? state_->finishedAt : std::chrono::steady_clock::time_point{};
}

size_t Work::bytes() const { return state_ ? state_->bytes : done_.bytes; }

// ---- Communicator ----------------------------------------------------------------

namespace {

/// Element size, or 0 for an invalid enum value (validation reports it).
size_t sizeOrZero(DataType type) {
  return static_cast<int>(type) < kNumDataTypes ? dataTypeSize(type) : 0;
}

}  // namespace

Communicator::~Communicator() {
  // The last handle ends the communicator.
  if (impl_ && impl_.use_count() == 1) impl_->destroy();
}

detail::CommunicatorImpl& Communicator::checked() const {
  if (!impl_) throw InvalidUsage("this Communicator handle is empty (moved from, or never created)");
  if (impl_->destroyed()) throw InvalidUsage("this communicator was destroyed; create a new Communicator");
  return *impl_;
}

int Communicator::rank() const { return checked().rank(); }
int Communicator::size() const { return checked().size(); }
Communicator Communicator::split(int color, int key) const {
  auto impl = checked().split(color, key);
  return impl ? Communicator(std::move(impl)) : Communicator(std::shared_ptr<detail::CommunicatorImpl>());
}

Communicator Communicator::dup() const {
  // Every rank is a member and the list is known: one exchange (the
  // group's id) instead of split's colors and keys first.
  std::vector<int> all(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) all[static_cast<size_t>(r)] = r;
  return subgroup(all);
}

Communicator Communicator::subgroup(const std::vector<int>& ranks) const {
  return Communicator(checked().subgroup(ranks));
}

std::string Communicator::transportName() const { return checked().transport().name(); }
bool Communicator::valid() const { return impl_ && !impl_->destroyed(); }

void Communicator::destroy() {
  if (impl_) impl_->destroy();
}

namespace {

CollectiveCall makeCall(Collective coll, const void* in, void* out, size_t count, DataType type, ReduceOp op,
                        int root) {
  CollectiveCall c;
  c.collective = coll;
  c.type = type;
  c.op = op;
  c.count = count;
  c.root = root;
  c.input = in;
  c.output = out;
  c.inPlace = in == out;
  return c;
}

}  // namespace

Work Communicator::allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                             const CollectiveOptions& options) {
  return checked().submit(makeCall(Collective::kAllreduce, in, out, count, type, op, 0), options);
}

Work Communicator::broadcast(const void* in, void* out, size_t count, DataType type, int root,
                             const CollectiveOptions& options) {
  auto& impl = checked();
  CollectiveCall c = makeCall(Collective::kBroadcast, in, out, count, type, ReduceOp::kSum, root);
  c.inPlace = in == out || (in == nullptr && impl.rank() != root);
  return impl.submit(c, options);
}

Work Communicator::reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root,
                          const CollectiveOptions& options) {
  return checked().submit(makeCall(Collective::kReduce, in, out, count, type, op, root), options);
}

Work Communicator::allgather(const void* in, void* out, size_t count, DataType type,
                             const CollectiveOptions& options) {
  auto& impl = checked();
  CollectiveCall c = makeCall(Collective::kAllgather, in, out, count, type, ReduceOp::kSum, 0);
  c.inPlace = out != nullptr &&
              in == static_cast<const char*>(out) + static_cast<size_t>(impl.rank()) * count * sizeOrZero(type);
  return impl.submit(c, options);
}

Work Communicator::reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                 const CollectiveOptions& options) {
  auto& impl = checked();
  CollectiveCall c = makeCall(Collective::kReduceScatter, in, out, count, type, op, 0);
  c.inPlace = in != nullptr &&
              out == static_cast<const char*>(in) + static_cast<size_t>(impl.rank()) * count * sizeOrZero(type);
  return impl.submit(c, options);
}

Work Communicator::barrier(const CollectiveOptions& options) {
  return checked().submit(makeCall(Collective::kBarrier, nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum, 0),
                          options);
}

std::vector<WorkPhase> Work::phases() const {
  std::vector<WorkPhase> out;
  if (!state_ || !state_->finished()) return out;
  for (const auto& p : state_->phases) out.push_back({p.first, p.second.first, p.second.second});
  return out;
}

ErrorFeedback::ErrorFeedback() : impl_(std::make_unique<compression::Residual>()) {}
ErrorFeedback::~ErrorFeedback() = default;
ErrorFeedback::ErrorFeedback(ErrorFeedback&&) noexcept = default;
ErrorFeedback& ErrorFeedback::operator=(ErrorFeedback&&) noexcept = default;
void ErrorFeedback::clear() { impl_->clear(); }
size_t ErrorFeedback::size() const { return impl_->size(); }
const float* ErrorFeedback::data() const { return impl_->data(); }
int ErrorFeedback::device() const { return impl_->device(); }

std::vector<std::string> algorithmNames(Collective collective) { return core::algorithmNamesOf(collective); }

Communicator::Selection Communicator::explainSelection(Collective collective, size_t count, DataType type) const {
  CollectiveCall c;
  c.collective = collective;
  c.count = count;
  c.type = type;
  auto& impl = checked();
  const algorithms::Team t{impl.transport(), impl.topology()};
  const auto choice = impl.selector().select(c, t, {});
  Selection out{choice.algorithm->name(), choice.why, {}};
  for (const auto& p : impl.selector().predictions(c, t)) out.predictedSeconds.emplace_back(p.algorithm->name(), p.seconds);
  return out;
}

std::string Communicator::layout() const {
  return topology::layoutName(checked().topology());
}

std::string Communicator::calibration() const {
  const auto& impl = checked();
  const auto* model = impl.selector().model();
  if (!model) throw InvalidUsage("calibration(): GRADCOMM_SELECT=rule uses no cost model");
  return topology::formatCalibration(model->costs(), topology::layoutName(impl.topology()));
}

std::string Communicator::describeTopology() const {
  const auto& impl = checked();
  const auto& v = impl.topology();
  std::string out = "topology: " + v.describe() + "; this host: " + v.hostLabel() + ", " + v.hardware().describe();
  if (const auto* model = impl.selector().model()) out += "\ncost model: " + model->costs().describe();
  else out += "\ncost model: off (GRADCOMM_SELECT=rule)";
  return out;
}

Communicator::DeviceEngine Communicator::deviceEngine(int device) const { return checked().deviceEngine(device); }

}  // namespace gradcomm
