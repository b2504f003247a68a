// Work::onComplete, Communicator::abort and the read-only view of the
// resolved configuration.
#include "base/log.hpp"
#include "base/params.hpp"
#include "core/communicator_impl.hpp"
#include "core/operation.hpp"
#include "gradcomm/communicator.hpp"

namespace gradcomm {

void Work::onComplete(std::function<void(std::exception_ptr)> callback) {
  if (!callback) return;
  if (state_) {
    state_->addCallback(std::move(callback));
    return;
  }
  // Finished inside the call that issued it, or default-constructed.
  try {
    callback(nullptr);
  } catch (...) {
    core::log(core::LogLevel::kWarn, -1, "a Work::onComplete callback threw (ignored)");
  }
}

void Communicator::abort(const std::string& reason) {
  auto& impl = checked();
  const std::string why = "rank " + std::to_string(impl.rank()) + " aborted the communicator: " + reason;
  // Tells the peers (the first failure's reason is the one that stays),
  // then stops the progress thread and fails this rank's pending
  // operations, as destroy() does, but leaves the handle valid.
  impl.engine().abort(ErrorCode::kInvalidUsage, why, true);
  impl.engine().shutdown(why);
}

std::exception_ptr Communicator::failure() const {
  if (!impl_) return makeErrorPtr(ErrorCode::kInvalidUsage, "this Communicator handle is empty (moved from, or never created)");
  try {
    impl_->engine().throwIfFailed();
  } catch (...) {
    return std::current_exception();
  }
  if (impl_->destroyed()) return makeErrorPtr(ErrorCode::kInvalidUsage, "this communicator was destroyed");
  return nullptr;
}

std::vector<ParamDescription> Communicator::parameters() const { return checked().parameters(); }

std::string Communicator::parameter(const std::string& name) const {
  const std::string canonical = core::canonicalParamName(name);
  if (canonical.empty()) {
    throw InvalidArgument("unknown parameter '" + name + "' (known: " + core::knownParamNames() + ")");
  }
  for (const auto& p : checked().parameters()) {
    if (p.name == canonical) return p.value;
  }
  throw InternalError("parameter " + canonical + " is missing from the communicator's configuration");
}

namespace detail {

const std::vector<ParamDescription>& CommunicatorImpl::parameters() const {
  std::call_once(parametersOnce_, [&] { parameters_ = core::describeConfig(config_); });
  return parameters_;
}

}  // namespace detail
}  // namespace gradcomm
