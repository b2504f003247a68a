// The "native" algorithm's collectives: MPI's nonblocking collectives,
// with an agreement allgather of call signatures before any data moves.
#include "transport/mpi_native.hpp"

#include <climits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"
#include "transport/call_signature.hpp"
#include "transport/mpi_graveyard.hpp"
#include "transport/mpi_transport.hpp"

namespace gradcomm::transport {
namespace {

// ---- native collectives ------------------------------------------------------

/// The MPI requests of a native collective and the small buffers they use.
struct NativeState {
  std::vector<MPI_Request> requests;
  /// An in-place allreduce's input, copied aside for MPI to read
  /// (MpiNative::stageLargeInPlace_).
  std::shared_ptr<std::vector<char>> staged;
  CallSignature agreeIn;
  std::vector<CallSignature> agreeOut;  // every rank's
};

/// A native collective: one or more MPI requests and an optional check that
/// runs on completion.
class NativeRequest : public Request {
 public:
  explicit NativeRequest(std::shared_ptr<Graveyard> graveyard)
      : graveyard_(std::move(graveyard)), state_(std::make_unique<NativeState>()) {}
  ~NativeRequest() override {
    for (MPI_Request r : state_->requests) {
      if (r != MPI_REQUEST_NULL) {
        // MPI forbids cancelling or freeing a collective: keep its requests
        // and the small buffers they write.
        std::vector<MPI_Request> requests = state_->requests;
        graveyard_->bury(std::move(requests), std::shared_ptr<NativeState>(std::move(state_)));
        return;
      }
    }
  }
  NativeState& state() { return *state_; }
  size_t received() const override { return 0; }  // a collective: no receive of its own
  std::string agreeWhat_;
  bool isAgree_ = false;
  int rank_ = 0;
  bool test() override {
    if (done_) return true;
    for (auto& r : state_->requests) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      int rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) throw TransportError("MPI native collective failed: " + mpiErrorText(rc));
      if (!flag) return false;
    }
    done_ = true;
    if (isAgree_) {
      const CallSignature& mine = state_->agreeIn;
      for (size_t r = 0; r < state_->agreeOut.size(); ++r) {
        const CallSignature& theirs = state_->agreeOut[r];
        if (!theirs.sameCall(mine) || theirs.seq != mine.seq) {
          throw MismatchError(mismatchMessage(rank_, agreeWhat_, mine, static_cast<int>(r), &theirs));
        }
      }
    }
    return true;
  }

 private:
  std::shared_ptr<Graveyard> graveyard_;
  std::unique_ptr<NativeState> state_;
  bool done_ = false;
};

template <int Type, int Op>
void userReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  static const kernels::ReduceFn fn =
      kernels::reduceFunction(static_cast<DataType>(Type), static_cast<ReduceOp>(Op), kernels::detectSimd());
  fn(inout, in, inout, static_cast<size_t>(*len));
}

// ops[type][op] for every type and every op but avg (kernels::opIndex: the
// columns are ReduceOp's sum, prod, min and max in order).
template <int Type, int... Op>
void createTypeOps(MPI_Op (&ops)[kNumDataTypes][4], std::integer_sequence<int, Op...>) {
  (MPI_Op_create(&userReduce<Type, Op>, 1, &ops[Type][Op]), ...);
}
template <int... Type>
void createUserOps(MPI_Op (&ops)[kNumDataTypes][4], std::integer_sequence<int, Type...>) {
  (createTypeOps<Type>(ops, std::make_integer_sequence<int, 4>{}), ...);
}

class MpiNative : public NativeCollectives {
 public:
  MpiNative(MPI_Comm comm, std::shared_ptr<Graveyard> graveyard) : comm_(comm), graveyard_(std::move(graveyard)) {
    // Every (type, op) pair uses gradcomm's own kernels as an MPI user
    // operation: MPI has no float16/bfloat16, its MIN/MAX do not propagate
    // NaN, and integer overflow is unspecified (Open MPI 4.1's vectorised
    // int8 sum saturates). The native algorithm therefore has exactly the
    // semantics of the others; the benchmark's MPI baseline calls
    // MPI_Allreduce with MPI's built-in operations instead.
    createUserOps(userOps_, std::make_integer_sequence<int, kNumDataTypes>{});
    int size = 1;
    MPI_Comm_size(comm_, &size);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    // Open MPI's nonblocking collectives (coll/libnbc, 4.x and 5.x) run an
    // in-place MPI_Iallreduce as a binomial reduce and broadcast of the
    // whole vector whatever its size, where the same call out of place gets
    // a ring or reduce-scatter/allgather from 4 ranks and 64 KiB up, about
    // 3x faster for large vectors between hosts. There, an in-place call of
    // that size copies its input aside and runs out of place.
    stageLargeInPlace_ =
        size >= 4 && std::string(version, static_cast<size_t>(length)).find("Open MPI") != std::string::npos;
  }
  ~MpiNative() override {
    if (!MpiEnvironment::usable()) return;
    for (auto& row : userOps_) {
      for (auto& op : row) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
      }
    }
  }

  RequestPtr agree(const CallSignature& call, const std::string& what) override {
    auto req = std::make_unique<NativeRequest>(graveyard_);
    req->isAgree_ = true;
    req->agreeWhat_ = what;
    int size = 1;
    MPI_Comm_rank(comm_, &req->rank_);
    MPI_Comm_size(comm_, &size);
    NativeState& st = req->state();
    st.agreeIn = call;
    st.agreeOut.resize(static_cast<size_t>(size));
    MPI_Request r;
    checkMpi(MPI_Iallgather(&st.agreeIn, sizeof(CallSignature), MPI_BYTE, st.agreeOut.data(), sizeof(CallSignature),
                            MPI_BYTE, comm_, &r),
             "MPI_Iallgather (call agreement)");
    st.requests.push_back(r);
    return req;
  }

  RequestPtr allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op) override {
    auto req = std::make_unique<NativeRequest>(graveyard_);
    const size_t elem = dataTypeSize(type);
    if (in == out && stageLargeInPlace_ && count * elem >= kStagedInPlaceBytes) {
      // One buffer serves call after call (a fresh one would fault in every
      // page each time). A call whose request outlived it (buried after an
      // abort, MPI may still read) keeps its copy: then a new one is made.
      if (!staging_ || staging_.use_count() > 1) staging_ = std::make_shared<std::vector<char>>();
      const char* from = static_cast<const char*>(in);
      staging_->assign(from, from + count * elem);
      req->state().staged = staging_;
      in = staging_->data();
    }
    forEachPart(count, [&](size_t offset, int n) {
      MPI_Request r;
      const void* src = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + offset * elem;
      checkMpi(MPI_Iallreduce(src, static_cast<char*>(out) + offset * elem, n, mpiDatatype(type), mpiOp(type, op),
                              comm_, &r),
               "MPI_Iallreduce");
      req->state().requests.push_back(r);
    });
    return req;
  }

  RequestPtr broadcast(void* buffer, size_t count, DataType type, int root) override {
    auto req = std::make_unique<NativeRequest>(graveyard_);
    const size_t elem = dataTypeSize(type);
    forEachPart(count, [&](size_t offset, int n) {
      MPI_Request r;
      checkMpi(MPI_Ibcast(static_cast<char*>(buffer) + offset * elem, n, mpiDatatype(type), root, comm_, &r),
               "MPI_Ibcast");
      req->state().requests.push_back(r);
    });
    return req;
  }

  RequestPtr reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op, int root) override {
    auto req = std::make_unique<NativeRequest>(graveyard_);
    const size_t elem = dataTypeSize(type);
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    forEachPart(count, [&](size_t offset, int n) {
      MPI_Request r;
      const void* src = static_cast<const char*>(in) + offset * elem;
      void* dst = static_cast<char*>(out) + offset * elem;
      if (in == out) {
        if (rank == root) src = MPI_IN_PLACE;
        else dst = nullptr;
      }
      checkMpi(MPI_Ireduce(src, dst, n, mpiDatatype(type), mpiOp(type, op), root, comm_, &r), "MPI_Ireduce");
      req->state().requests.push_back(r);
    });
    return req;
  }

  RequestPtr allgather(const void* in, void* out, size_t count, DataType type) override {
    requireIntCount(count, "allgather");
    auto req = std::make_unique<NativeRequest>(graveyard_);
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    const void* src = in == static_cast<char*>(out) + rank * count * dataTypeSize(type) ? MPI_IN_PLACE : in;
    MPI_Request r;
    checkMpi(MPI_Iallgather(src, static_cast<int>(count), mpiDatatype(type), out, static_cast<int>(count),
                            mpiDatatype(type), comm_, &r),
             "MPI_Iallgather");
    req->state().requests.push_back(r);
    return req;
  }

  RequestPtr reduceScatter(const void* in, void* out, size_t count, DataType type, ReduceOp op) override {
    requireIntCount(count, "reduce-scatter");
    auto req = std::make_unique<NativeRequest>(graveyard_);
    MPI_Request r;
    checkMpi(MPI_Ireduce_scatter_block(in, out, static_cast<int>(count), mpiDatatype(type), mpiOp(type, op),
                                       comm_, &r),
             "MPI_Ireduce_scatter_block");
    req->state().requests.push_back(r);
    return req;
  }

  RequestPtr barrier() override {
    auto req = std::make_unique<NativeRequest>(graveyard_);
    MPI_Request r;
    checkMpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    req->state().requests.push_back(r);
    return req;
  }

 private:
  template <typename F>
  static void forEachPart(size_t count, F&& f) {
    constexpr size_t kPart = size_t{1} << 30;  // elements per MPI call
    if (count == 0) {
      f(0, 0);
      return;
    }
    for (size_t offset = 0; offset < count; offset += kPart) {
      f(offset, static_cast<int>(std::min(kPart, count - offset)));
    }
  }
  static void requireIntCount(size_t count, const char* what) {
    if (count > static_cast<size_t>(INT_MAX)) {
      throw UnsupportedError(std::string("native ") + what + " takes at most 2^31-1 elements per rank (MPI's int "
                             "count); got " + std::to_string(count) + ": use the ring algorithm");
    }
  }
  MPI_Op mpiOp(DataType type, ReduceOp op) const { return userOps_[static_cast<int>(type)][kernels::opIndex(op)]; }

  /// libnbc's size threshold for its ring and reduce-scatter/allgather.
  static constexpr size_t kStagedInPlaceBytes = 64 * 1024;

  MPI_Comm comm_;
  std::shared_ptr<Graveyard> graveyard_;
  MPI_Op userOps_[kNumDataTypes][4];
  bool stageLargeInPlace_ = false;  ///< copy large in-place allreduces aside (see the constructor)
  std::shared_ptr<std::vector<char>> staging_;  ///< the copy's buffer, shared with the call that uses it
};

}  // namespace

std::unique_ptr<NativeCollectives> makeMpiNative(MPI_Comm comm, std::shared_ptr<Graveyard> graveyard) {
  return std::make_unique<MpiNative>(comm, std::move(graveyard));
}

}  // namespace gradcomm::transport
