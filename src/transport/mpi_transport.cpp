#include "transport/mpi_transport.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include <unistd.h>

#include "gradcomm/error.hpp"
#include "kernels/reduce.hpp"

namespace gradcomm::transport {
namespace {

constexpr int kControlTag = 7;
// Call checks (Tag::kCallCheck) travel on the control communicator too, where
// no data message can match them; one per operation per pair, in order.
constexpr int kCallCheckTag = 8;
// MPI counts are int: messages above this are sent as several parts, which
// MPI's non-overtaking rule keeps in order.
constexpr size_t kMaxPartBytes = size_t{1} << 30;

std::string mpiErrorText(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace

/// Requests abandoned while still in flight because their operation failed.
/// Nothing here is ever waited on: a receive already matched with a peer that
/// died never completes (MPI_Cancel cannot take it back, and MPI_Wait would
/// block forever), and MPI forbids cancelling or freeing a nonblocking
/// collective. Each grave is tested now and then and forgotten once
/// complete; what is still pending when the transport goes is leaked, with
/// the memory it writes into, since MPI may still write there.
class Graveyard {
 public:
  Graveyard() = default;
  Graveyard(const Graveyard&) = delete;
  Graveyard& operator=(const Graveyard&) = delete;
  ~Graveyard() {
    sweep();
    for (auto& g : graves_) (void)new Grave(std::move(g));  // leaked on purpose (see above)
  }
  /// Takes pending `requests` and `keepAlive`, memory gradcomm owns that they write into.
  void bury(std::vector<MPI_Request> requests, std::shared_ptr<void> keepAlive = {}) {
    graves_.push_back({std::move(requests), std::move(keepAlive)});
  }
  /// Tests every pending request once, never blocking; drops complete graves.
  void sweep() {
    if (graves_.empty() || !MpiEnvironment::usable()) return;
    for (size_t i = 0; i < graves_.size();) {
      bool pending = false;
      for (auto& r : graves_[i].requests) {
        int flag = 0;
        if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        pending = pending || r != MPI_REQUEST_NULL;
      }
      if (pending) {
        ++i;
      } else {
        graves_[i] = std::move(graves_.back());
        graves_.pop_back();
      }
    }
  }
  bool empty() const { return graves_.empty(); }

 private:
  struct Grave {
    std::vector<MPI_Request> requests;
    std::shared_ptr<void> keepAlive;
  };
  std::vector<Grave> graves_;
};

namespace {

/// Cancels the receives among `requests`, frees the sends, and tests what
/// is left a bounded number of times: a cancelled receive completes at once
/// unless MPI already matched it. Whatever is still pending then goes to the
/// graveyard. Never blocks.
void abandon(std::vector<MPI_Request>& requests, bool isRecv, Graveyard& graveyard) {
  if (!MpiEnvironment::usable()) return;
  std::vector<MPI_Request> pending;
  for (auto& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    if (!isRecv) {
      MPI_Request_free(&r);  // the send completes (or not) in the background
      continue;
    }
    MPI_Cancel(&r);
    pending.push_back(r);
    r = MPI_REQUEST_NULL;
  }
  constexpr int kCancelPolls = 100;
  for (int i = 0; i < kCancelPolls && !pending.empty(); ++i) {
    for (size_t k = 0; k < pending.size();) {
      int flag = 0;
      MPI_Test(&pending[k], &flag, MPI_STATUS_IGNORE);
      if (pending[k] == MPI_REQUEST_NULL) {
        pending[k] = pending.back();
        pending.pop_back();
      } else {
        ++k;
      }
    }
  }
  if (!pending.empty()) graveyard.bury(std::move(pending));
}

/// One logical transfer, split into parts of at most kMaxPartBytes.
class MpiRequest : public Request {
 public:
  MpiRequest(bool isRecv, int peer, int myRank, Graveyard& graveyard)
      : isRecv_(isRecv), peer_(peer), myRank_(myRank), graveyard_(graveyard) {}
  ~MpiRequest() override {
    if (!done_) abandon(requests_, isRecv_, graveyard_);
  }
  void add(MPI_Request r, size_t bytes) {
    requests_.push_back(r);
    expected_.push_back(bytes);
  }
  bool test() override {
    if (done_) return true;
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      int rc = MPI_Test(&requests_[i], &flag, &status);
      if (rc != MPI_SUCCESS) fail(rc);
      if (!flag) return false;
      if (isRecv_) {
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        if (static_cast<size_t>(count) != expected_[i]) {
          throw MismatchError("rank " + std::to_string(myRank_) + " received " + std::to_string(count) +
                               " bytes from rank " + std::to_string(peer_) + " where " +
                               std::to_string(expected_[i]) +
                               " were expected: the ranks called the collective with different counts");
        }
      }
    }
    done_ = true;
    return true;
  }

 private:
  [[noreturn]] void fail(int rc) const {
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE) {
      throw MismatchError("rank " + std::to_string(myRank_) + " received a larger message from rank " +
                           std::to_string(peer_) +
                           " than expected: the ranks called the collective with different counts");
    }
    throw TransportError(std::string("MPI ") + (isRecv_ ? "receive from" : "send to") + " rank " +
                         std::to_string(peer_) + " failed: " + mpiErrorText(rc));
  }
  bool isRecv_;
  int peer_;
  int myRank_;
  Graveyard& graveyard_;  // the transport's, which outlives its requests
  bool done_ = false;
  std::vector<MPI_Request> requests_;
  std::vector<size_t> expected_;
};

// ---- native collectives ------------------------------------------------------

/// The MPI requests of a native collective and the small buffers they use.
struct NativeState {
  std::vector<MPI_Request> requests;
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

template <int Type>
void createUserOps(MPI_Op ops[kNumDataTypes][4]) {
  MPI_Op_create(&userReduce<Type, static_cast<int>(ReduceOp::kSum)>, 1, &ops[Type][0]);
  MPI_Op_create(&userReduce<Type, static_cast<int>(ReduceOp::kProd)>, 1, &ops[Type][1]);
  MPI_Op_create(&userReduce<Type, static_cast<int>(ReduceOp::kMin)>, 1, &ops[Type][2]);
  MPI_Op_create(&userReduce<Type, static_cast<int>(ReduceOp::kMax)>, 1, &ops[Type][3]);
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
    createUserOps<static_cast<int>(DataType::kFloat32)>(userOps_);
    createUserOps<static_cast<int>(DataType::kFloat64)>(userOps_);
    createUserOps<static_cast<int>(DataType::kFloat16)>(userOps_);
    createUserOps<static_cast<int>(DataType::kBFloat16)>(userOps_);
    createUserOps<static_cast<int>(DataType::kInt8)>(userOps_);
    createUserOps<static_cast<int>(DataType::kUInt8)>(userOps_);
    createUserOps<static_cast<int>(DataType::kInt32)>(userOps_);
    createUserOps<static_cast<int>(DataType::kInt64)>(userOps_);
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
  MPI_Op mpiOp(DataType type, ReduceOp op) const {
    const int k = static_cast<int>(type);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return userOps_[k][0];
      case ReduceOp::kProd: return userOps_[k][1];
      case ReduceOp::kMin: return userOps_[k][2];
      case ReduceOp::kMax: return userOps_[k][3];
    }
    return userOps_[k][0];
  }

  MPI_Comm comm_;
  std::shared_ptr<Graveyard> graveyard_;
  MPI_Op userOps_[kNumDataTypes][4];
};

}  // namespace

MPI_Datatype mpiDatatype(DataType type) {
  switch (type) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MpiTagLayout MpiTagLayout::forUpperBound(long long tagUpperBound) {
  int bits = 0;
  while (bits < 31 && (1ll << (bits + 1)) - 1 <= tagUpperBound) ++bits;
  if (bits < 15) {
    throw UnsupportedError("this MPI's tag upper bound " + std::to_string(tagUpperBound) +
                           " is too small for gradcomm (needs at least 2^15 - 1)");
  }
  MpiTagLayout l;
  l.seqBits = bits >= 31 ? 7 : 4;
  l.fingerprintBits = bits >= 31 ? 10 : 6;
  l.messageBits = bits - l.seqBits - l.fingerprintBits;
  return l;
}

int MpiTagLayout::encode(const Tag& tag) const {
  uint64_t v = ((tag.seq & seqMask()) << (fingerprintBits + messageBits)) |
               (static_cast<uint64_t>(tag.fingerprint & fingerprintMask()) << messageBits) |
               (tag.message & ((1u << messageBits) - 1));
  return static_cast<int>(v);
}

uint64_t MpiTagLayout::seqOf(int mpiTag) const {
  return (static_cast<uint64_t>(mpiTag) >> (fingerprintBits + messageBits)) & seqMask();
}

uint32_t MpiTagLayout::fingerprintOf(int mpiTag) const {
  return (static_cast<uint32_t>(mpiTag) >> messageBits) & fingerprintMask();
}

MpiTransport::MpiTransport(MPI_Comm comm, std::shared_ptr<MpiEnvironment> env, size_t shmChunkBytes)
    : env_(std::move(env)) {
  checkMpi(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
  checkMpi(MPI_Comm_dup(comm, &control_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(data_, &rank_);
  MPI_Comm_size(data_, &size_);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(data_, MPI_TAG_UB, &ub, &flag);
  layout_ = MpiTagLayout::forUpperBound(flag && ub ? *ub : 32767);

  MPI_Comm local = MPI_COMM_NULL;
  checkMpi(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  int localSize = 0;
  MPI_Comm_size(local, &localSize);
  MPI_Group localGroup, dataGroup;
  MPI_Comm_group(local, &localGroup);
  MPI_Comm_group(data_, &dataGroup);
  std::vector<int> in(static_cast<size_t>(localSize)), out(static_cast<size_t>(localSize));
  for (int i = 0; i < localSize; ++i) in[static_cast<size_t>(i)] = i;
  MPI_Group_translate_ranks(localGroup, localSize, in.data(), dataGroup, out.data());
  MPI_Group_free(&localGroup);
  MPI_Group_free(&dataGroup);
  localRanks_ = out;
  std::sort(localRanks_.begin(), localRanks_.end());
  // Every rank's host leader, for the topology view.
  int leader = localRanks_.front();
  hostLeaders_.assign(static_cast<size_t>(size_), 0);
  checkMpi(MPI_Allgather(&leader, 1, MPI_INT, hostLeaders_.data(), 1, MPI_INT, data_), "MPI_Allgather");
  if (shmChunkBytes > 0 && localSize > 1) setUpSharedMemory(local, shmChunkBytes);
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  hostName_ = std::string(name, static_cast<size_t>(len)) + "/node-of-rank" + std::to_string(localRanks_.front());

  graveyard_ = std::make_shared<Graveyard>();
  native_ = std::make_unique<MpiNative>(data_, graveyard_);
  postControlReceive();
}

MpiTransport::~MpiTransport() {
  if (!MpiEnvironment::usable()) return;
  native_.reset();
  // Nothing here may block: a peer may be dead. The control receive is
  // cancelled like any other; abandoned requests stay in the graveyard,
  // which leaks what never completes.
  std::vector<MPI_Request> control{controlRecv_};
  controlRecv_ = MPI_REQUEST_NULL;
  abandon(control, true, *graveyard_);
  for (auto& a : abortSends_) {
    if (a->request != MPI_REQUEST_NULL) MPI_Request_free(&a->request);
  }
  graveyard_.reset();
  MPI_Comm_free(&control_);
  MPI_Comm_free(&data_);
}

bool MpiTransport::abandonedTransfersPending() {
  graveyard_->sweep();
  return !graveyard_->empty();
}

void MpiTransport::setUpSharedMemory(MPI_Comm local, size_t chunkBytes) {
  int localRank = 0, localSize = 1;
  MPI_Comm_rank(local, &localRank);
  MPI_Comm_size(local, &localSize);
  const size_t bufferBytes = chunkBytes * static_cast<size_t>(localSize);
  const size_t total = ShmGroup::strideFor(bufferBytes) * static_cast<size_t>(localSize);
  // Local rank 0 creates the segment and tells the others its name; an
  // empty name means it failed, and everyone goes on without shared memory.
  std::array<char, 256> name{};
  std::shared_ptr<ShmSegment> seg;
  std::string why;
  if (localRank == 0) {
    try {
      seg = ShmSegment::create(total);
      std::strncpy(name.data(), seg->name().c_str(), name.size() - 1);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, local);
  int ok = name[0] != 0 ? 1 : 0;
  if (ok && localRank != 0) {
    try {
      seg = ShmSegment::open(name.data(), total);
    } catch (const Error& e) {
      why = e.what();
      ok = 0;
    }
  }
  int allOk = 0;
  MPI_Allreduce(&ok, &allOk, 1, MPI_INT, MPI_MIN, local);
  if (!allOk) {
    if (!why.empty()) std::fprintf(stderr, "gradcomm[rank %d] warn: no shared memory: %s\n", rank_, why.c_str());
    return;
  }
  auto group = std::make_unique<ShmGroup>(localRanks_, localRank, bufferBytes, seg->data(), seg);
  group->block(localRank).pid = static_cast<int32_t>(getpid());
  // Once every rank has mapped it, the name can go: nothing is left in
  // /dev/shm even if processes die later.
  MPI_Barrier(local);
  if (localRank == 0) seg->unlink();
  shm_ = std::move(group);
}

void MpiTransport::postControlReceive() {
  controlBuffer_.fill(0);
  checkMpi(MPI_Irecv(controlBuffer_.data(), static_cast<int>(controlBuffer_.size()) - 1, MPI_CHAR, MPI_ANY_SOURCE,
                     kControlTag, control_, &controlRecv_),
           "MPI_Irecv (control)");
}

RequestPtr MpiTransport::isend(int peer, const void* data, size_t bytes, const Tag& tag) {
  auto req = std::make_unique<MpiRequest>(false, peer, rank_, *graveyard_);
  const bool check = tag.message == Tag::kCallCheck;
  const int mpiTag = check ? kCallCheckTag : layout_.encode(tag);
  MPI_Comm comm = check ? control_ : data_;
  size_t offset = 0;
  do {
    size_t part = std::min(kMaxPartBytes, bytes - offset);
    MPI_Request r;
    int rc = MPI_Isend(static_cast<const char*>(data) + offset, static_cast<int>(part), MPI_BYTE, peer, mpiTag, comm,
                       &r);
    if (rc != MPI_SUCCESS) {
      throw TransportError("MPI_Isend to rank " + std::to_string(peer) + " failed: " + mpiErrorText(rc));
    }
    req->add(r, part);
    offset += part;
  } while (offset < bytes);
  return req;
}

RequestPtr MpiTransport::irecv(int peer, void* data, size_t bytes, const Tag& tag) {
  auto req = std::make_unique<MpiRequest>(true, peer, rank_, *graveyard_);
  const bool check = tag.message == Tag::kCallCheck;
  const int mpiTag = check ? kCallCheckTag : layout_.encode(tag);
  MPI_Comm comm = check ? control_ : data_;
  size_t offset = 0;
  do {
    size_t part = std::min(kMaxPartBytes, bytes - offset);
    MPI_Request r;
    int rc = MPI_Irecv(static_cast<char*>(data) + offset, static_cast<int>(part), MPI_BYTE, peer, mpiTag, comm, &r);
    if (rc != MPI_SUCCESS) {
      throw TransportError("MPI_Irecv from rank " + std::to_string(peer) + " failed: " + mpiErrorText(rc));
    }
    req->add(r, part);
    offset += part;
  } while (offset < bytes);
  return req;
}

bool MpiTransport::probeMismatch(int peer, const Tag& expected) {
  if (announcedMismatch(peer, expected)) return true;
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(peer, MPI_ANY_TAG, data_, &flag, &status) != MPI_SUCCESS || !flag) return false;
  return layout_.seqOf(status.MPI_TAG) == (expected.seq & layout_.seqMask()) &&
         layout_.fingerprintOf(status.MPI_TAG) != (expected.fingerprint & layout_.fingerprintMask());
}

void MpiTransport::broadcastAbort(const std::string& reason) {
  std::string text = reason.substr(0, controlBuffer_.size() - 64);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    auto a = std::make_unique<AbortSend>();
    a->text = text;
    if (MPI_Isend(a->text.data(), static_cast<int>(a->text.size()), MPI_CHAR, peer, kControlTag, control_,
                  &a->request) == MPI_SUCCESS) {
      abortSends_.push_back(std::move(a));
    }
  }
}

std::optional<std::string> MpiTransport::pollAbort() {
  graveyard_->sweep();
  for (auto& a : abortSends_) {  // keep the sends moving
    if (a->request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&a->request, &done, MPI_STATUS_IGNORE);
    }
  }
  if (controlRecv_ == MPI_REQUEST_NULL) return std::nullopt;
  int flag = 0;
  MPI_Status status;
  if (MPI_Test(&controlRecv_, &flag, &status) != MPI_SUCCESS || !flag) return std::nullopt;
  std::string text = "rank " + std::to_string(status.MPI_SOURCE) + ": " + std::string(controlBuffer_.data());
  postControlReceive();
  return text;
}

}  // namespace gradcomm::transport
