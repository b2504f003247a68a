#include "transport/mpi_transport.hpp"

#include "transport/bootstrap.hpp"
#include "transport/group_transport.hpp"
#include "transport/mpi_bootstrap.hpp"
#include "transport/mpi_graveyard.hpp"
#include "transport/mpi_native.hpp"

#include <algorithm>
#include <utility>

#include "gradcomm/error.hpp"

namespace gradcomm::transport {
namespace {

// Abort notices (Tag::kAbort) travel on the control communicator.
constexpr int kControlTag = 7;
// Call checks (Tag::kCallCheck) travel on the control communicator too, where
// no data message can match them; one per operation per pair, in order.
constexpr int kCallCheckTag = 8;
// Gossip pushes (Tag::kGossip) travel on the control communicator with their
// push number modulo kGossipSteps above this tag: never matched by data or
// control messages, and the window of receives a receiver posts per sender
// is far below the modulus.
constexpr int kGossipTagBase = 16;
constexpr uint64_t kGossipSteps = 16384;

int controlTagOf(const Tag& tag) {
  if (tag.message == Tag::kCallCheck) return kCallCheckTag;
  if (tag.message == Tag::kAbort) return kControlTag;
  return kGossipTagBase + static_cast<int>(tag.seq % kGossipSteps);
}
// MPI counts are int: messages above this are sent as several parts, which
// MPI's non-overtaking rule keeps in order.
constexpr size_t kMaxPartBytes = size_t{1} << 30;

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

}  // namespace

class MpiRequest;

/// One progress pass for all of a transport's transfers. Every MPI_Test of
/// an incomplete request runs the library's progress engine once (with the
/// TCP transport, a poll() system call), so testing each of an operation's
/// transfers in turn paid that several times per look (an operation's
/// send, its receive and the call check's two). Here the first
/// test in a look runs one MPI_Testsome over every open transfer and the
/// others read its results: a request asked again before any other request
/// started a new pass starts one itself, so a lone request still progresses
/// on every test.
class MpiProgress {
 public:
  struct Part {
    MPI_Request request = MPI_REQUEST_NULL;
    size_t expected = 0;  ///< bytes
    bool done = false;
    /// A receive: only receives ask MPI how many bytes arrived (a send's
    /// count is never read, and MPI_Get_count cost about 45 instructions
    /// per transfer).
    bool recv = false;
    int error = MPI_SUCCESS;
    int count = 0;  ///< bytes received
    int source = MPI_ANY_SOURCE;  ///< the sender, once a receive completed
  };
  /// `graveyard`: swept on every pass, so abandoned requests complete.
  explicit MpiProgress(std::shared_ptr<Graveyard> graveyard) : graveyard_(std::move(graveyard)) {}
  void enlist(MpiRequest* r) { live_.push_back(r); }
  void discharge(MpiRequest* r) {
    auto it = std::find(live_.begin(), live_.end(), r);
    if (it == live_.end()) return;
    *it = live_.back();
    live_.pop_back();
  }
  uint64_t pass() const { return pass_; }
  void run();

 private:
  std::shared_ptr<Graveyard> graveyard_;
  std::vector<MpiRequest*> live_;
  std::vector<MPI_Request> handles_;
  std::vector<Part*> owners_;
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  uint64_t pass_ = 0;
};

/// One logical transfer, split into parts of at most kMaxPartBytes.
class MpiRequest : public Request {
 public:
  MpiRequest(bool isRecv, int peer, int myRank, Graveyard& graveyard, std::shared_ptr<MpiProgress> progress,
             bool upTo = false)
      : isRecv_(isRecv),
        upTo_(upTo),
        peer_(peer),
        myRank_(myRank),
        graveyard_(graveyard),
        progress_(std::move(progress)) {
    seen_ = progress_->pass();
    progress_->enlist(this);
  }
  ~MpiRequest() override {
    progress_->discharge(this);
    if (done_) return;
    std::vector<MPI_Request> open;
    for (size_t i = 0; i < parts_; ++i) open.push_back(part(i).request);
    abandon(open, isRecv_, graveyard_);
  }
  void add(MPI_Request r, size_t bytes) {
    MpiProgress::Part p;
    p.request = r;
    p.expected = bytes;
    p.recv = isRecv_;
    if (parts_ == 0) {
      first_ = p;
    } else {
      more_.push_back(p);
    }
    ++parts_;
  }
  /// The parts still in flight, for MpiProgress::run().
  void collectOpen(std::vector<MPI_Request>& handles, std::vector<MpiProgress::Part*>& owners) {
    for (size_t i = 0; i < parts_; ++i) {
      MpiProgress::Part& p = part(i);
      if (p.done || p.request == MPI_REQUEST_NULL) continue;
      handles.push_back(p.request);
      owners.push_back(&p);
    }
  }
  bool test() override {
    if (done_) return true;
    if (seen_ == progress_->pass()) progress_->run();
    seen_ = progress_->pass();
    bool all = true;
    for (size_t i = 0; i < parts_; ++i) {
      const MpiProgress::Part& p = part(i);
      if (!p.done) {
        all = false;
        continue;
      }
      if (p.error != MPI_SUCCESS) fail(p.error);
      if (isRecv_ && !upTo_ && static_cast<size_t>(p.count) != p.expected) {
        throw MismatchError("rank " + std::to_string(myRank_) + " received " + std::to_string(p.count) +
                            " bytes from rank " + std::to_string(peer_) + " where " + std::to_string(p.expected) +
                            " were expected: the count (or data type) differs between the ranks' calls");
      }
    }
    if (!all) return false;
    done_ = true;
    return true;
  }
  size_t received() const override {
    size_t bytes = 0;
    for (size_t i = 0; i < parts_; ++i) bytes += static_cast<size_t>(part(i).count);
    return bytes;
  }
  int source() const override { return isRecv_ && done_ ? first_.source : -1; }

 private:
  MpiProgress::Part& part(size_t i) { return i == 0 ? first_ : more_[i - 1]; }
  const MpiProgress::Part& part(size_t i) const { return i == 0 ? first_ : more_[i - 1]; }
  [[noreturn]] void fail(int rc) const {
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE) {
      throw MismatchError("rank " + std::to_string(myRank_) + " received a larger message from rank " +
                           std::to_string(peer_) +
                           " than expected: the count (or data type) differs between the ranks' calls");
    }
    throw TransportError(std::string("MPI ") + (isRecv_ ? "receive from" : "send to") + " rank " +
                         std::to_string(peer_) + " failed: " + mpiErrorText(rc));
  }
  bool isRecv_;
  bool upTo_;  ///< a call-check receive: the message may be shorter than the buffer
  int peer_;
  int myRank_;
  Graveyard& graveyard_;  // the transport's, which outlives its requests
  std::shared_ptr<MpiProgress> progress_;
  uint64_t seen_ = 0;  ///< the last pass whose results this request read
  bool done_ = false;
  // Parts of at most kMaxPartBytes: nearly every transfer has one, kept
  // here (a vector per transfer cost a heap allocation per message); the
  // others follow in more_. MpiProgress::run() holds pointers to them
  // during a pass; parts are only added before the first pass.
  size_t parts_ = 0;
  MpiProgress::Part first_;
  std::vector<MpiProgress::Part> more_;
};

void MpiProgress::run() {
  ++pass_;
  graveyard_->sweep();
  handles_.clear();
  owners_.clear();
  for (MpiRequest* r : live_) r->collectOpen(handles_, owners_);
  if (handles_.empty()) return;
  const int n = static_cast<int>(handles_.size());
  // Grown, never shrunk: the number of open transfers changes from pass to
  // pass, and growing a vector again value-initialises what it adds.
  if (indices_.size() < handles_.size()) {
    indices_.resize(handles_.size());
    statuses_.resize(handles_.size());
  }
  int completed = 0;
  const int rc = MPI_Testsome(n, handles_.data(), &completed, indices_.data(), statuses_.data());
  // MPI frees what completed (its handle is now MPI_REQUEST_NULL).
  for (size_t i = 0; i < handles_.size(); ++i) owners_[i]->request = handles_[i];
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    // The call itself failed: every open transfer reports it when tested.
    for (MpiProgress::Part* p : owners_) {
      p->done = true;
      p->error = rc;
    }
    return;
  }
  if (completed == MPI_UNDEFINED) return;
  for (int k = 0; k < completed; ++k) {
    const size_t i = static_cast<size_t>(indices_[static_cast<size_t>(k)]);
    const MPI_Status& st = statuses_[static_cast<size_t>(k)];
    MpiProgress::Part* p = owners_[i];
    p->done = true;
    p->error = rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : MPI_SUCCESS;
    if (p->error == MPI_SUCCESS && p->recv) {
      MPI_Get_count(&st, MPI_BYTE, &p->count);
      p->source = st.MPI_SOURCE;
    }
  }
}

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
    : env_(std::move(env)), shmChunkBytes_(shmChunkBytes) {
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
  // Every host's ranks, named by each rank's lowest host-local rank.
  {
    int leader = localRanks_.front();
    std::vector<int> leaders(static_cast<size_t>(size_));
    checkMpi(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, data_), "MPI_Allgather (host layout)");
    hosts_ = groupHosts(std::vector<long long>(leaders.begin(), leaders.end()));
  }
  if (shmChunkBytes > 0) {
    MpiBootstrap boot(data_);
    shm_ = setUpSharedMemory(boot, localRanks_, shmChunkBytes);
  }
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  hostName_ = std::string(name, static_cast<size_t>(len)) + "/node-of-rank" + std::to_string(localRanks_.front());

  graveyard_ = std::make_shared<Graveyard>();
  progress_ = std::make_shared<MpiProgress>(graveyard_);
  native_ = makeMpiNative(data_, graveyard_);
}

MpiTransport::MpiTransport(MpiTransport& parent, MPI_Comm data, const std::vector<int>& members)
    : env_(parent.env_), data_(data), layout_(parent.layout_) {
  try {
    setUpGroup(parent, members);
  } catch (...) {
    if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
    MPI_Comm_free(&data_);
    throw;
  }
}

void MpiTransport::setUpGroup(MpiTransport& parent, const std::vector<int>& members) {
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  checkMpi(MPI_Comm_dup(data_, &control_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(data_, &rank_);
  MPI_Comm_size(data_, &size_);
  // The hosts as the parent knows them, in the group's numbering.
  const std::vector<long long> parentHostOf = hostIndex(parent.hosts_);
  std::vector<long long> hostOf;
  for (int m : members) hostOf.push_back(parentHostOf[static_cast<size_t>(m)]);
  hosts_ = groupHosts(hostOf);
  for (const auto& host : hosts_) {
    if (std::find(host.begin(), host.end(), rank_) != host.end()) localRanks_ = host;
  }
  hostName_ = parent.hostName_;
  shm_ = sharedMemoryForGroup(parent.hosts_, parent.shm_.get(), parent.shmChunkBytes_, members, &shmChunkBytes_);
  // One progress pass and one graveyard for the context's transfers and the
  // group's: the engine's look at abandoned transfers (the context's
  // transport) then covers the group's too.
  graveyard_ = parent.graveyard_;
  progress_ = parent.progress_;
  native_ = makeMpiNative(data_, graveyard_);
}

MpiTransport::~MpiTransport() {
  if (!MpiEnvironment::usable()) return;
  native_.reset();
  // Nothing here may block: a peer may be dead. Abandoned requests stay in
  // the graveyard, which leaks what never completes.
  graveyard_.reset();
  MPI_Comm_free(&control_);
  MPI_Comm_free(&data_);
}

bool MpiTransport::abandonedTransfersPending() {
  graveyard_->sweep();
  return !graveyard_->empty();
}

RequestPtr MpiTransport::isend(int peer, const void* data, size_t bytes, const Tag& tag) {
  return post(false, peer, const_cast<void*>(data), bytes, tag);
}

RequestPtr MpiTransport::irecv(int peer, void* data, size_t bytes, const Tag& tag) {
  return post(true, peer, data, bytes, tag);
}

RequestPtr MpiTransport::irecvAny(void* data, size_t capacity, const Tag& tag) {
  return post(true, MPI_ANY_SOURCE, data, capacity, tag);
}

RequestPtr MpiTransport::post(bool recv, int peer, void* data, size_t bytes, const Tag& tag) {
  checkGroup(tag);
  const bool upTo = recv && (tag.message == Tag::kCallCheck || peer == MPI_ANY_SOURCE);
  auto req = std::make_unique<MpiRequest>(recv, peer, rank_, *graveyard_, progress_, upTo);
  const bool check = tag.control();
  const int mpiTag = check ? controlTagOf(tag) : layout_.encode(tag);
  MPI_Comm comm = check ? control_ : data_;
  size_t offset = 0;
  do {
    size_t part = std::min(kMaxPartBytes, bytes - offset);
    MPI_Request r;
    char* at = static_cast<char*>(data) + offset;
    const int n = static_cast<int>(part);
    const int rc = recv ? MPI_Irecv(at, n, MPI_BYTE, peer, mpiTag, comm, &r)
                        : MPI_Isend(at, n, MPI_BYTE, peer, mpiTag, comm, &r);
    if (rc != MPI_SUCCESS) {
      throw TransportError(std::string(recv ? "MPI_Irecv from" : "MPI_Isend to") + " rank " + std::to_string(peer) +
                           " failed: " + mpiErrorText(rc));
    }
    req->add(r, part);
    offset += part;
  } while (offset < bytes);
  return req;
}

std::unique_ptr<Transport> MpiTransport::subgroup(const std::vector<int>& members) {
  MPI_Group all = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
  MPI_Comm_group(data_, &all);
  checkMpi(MPI_Group_incl(all, static_cast<int>(members.size()), members.data(), &some), "MPI_Group_incl");
  MPI_Comm comm = MPI_COMM_NULL;
  // Only the members call it; the tag keeps it apart from other groups
  // formed at the same time over this communicator.
  const int rc = MPI_Comm_create_group(data_, some, kControlTag, &comm);
  MPI_Group_free(&some);
  MPI_Group_free(&all);
  checkMpi(rc, "MPI_Comm_create_group");
  return std::unique_ptr<Transport>(new MpiTransport(*this, comm, members));
}

void MpiTransport::checkGroup(const Tag& tag) const {
  if (tag.comm != 0) {
    throw InternalError("the MPI transport carries no group in its tags; groups get an MPI communicator of their own");
  }
}

bool MpiTransport::probeMismatch(int peer, const Tag& expected) {
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(peer, MPI_ANY_TAG, data_, &flag, &status) != MPI_SUCCESS || !flag) return false;
  return layout_.seqOf(status.MPI_TAG) == (expected.seq & layout_.seqMask()) &&
         layout_.fingerprintOf(status.MPI_TAG) != (expected.fingerprint & layout_.fingerprintMask());
}

}  // namespace gradcomm::transport
