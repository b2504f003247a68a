// The collectives and point-to-point calls of the NCCL ABI. Host buffers
// run on gradcomm's communicator; device buffers go to the real NCCL, and
// where this communicator has none (no NCCL in the process, or ranks that
// share a GPU, which NCCL refuses) collectives on device buffers run on
// gradcomm's communicator too, through its device path.
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "capi/api_common.hpp"
#include "capi/device_compression.hpp"
#include "capi/forward.hpp"
#include "capi/group.hpp"

using gradcomm::Collective;
using gradcomm::DataType;
using gradcomm::ReduceOp;
using gradcomm::Work;
using namespace gradcomm::capi;

namespace {

/// ncclInvalidArgument unless `elements` elements of `bytes` fit in size_t.
ncclResult_t checkSize(const char* function, size_t elements, size_t bytes, size_t* total) {
  if (bytes && elements > std::numeric_limits<size_t>::max() / bytes) {
    return invalidArgument(function, "count", std::to_string(elements) + " elements overflow the address space");
  }
  *total = elements * bytes;
  return ncclSuccess;
}

ncclResult_t checkPointer(const char* function, const char* name, const void* p, size_t count) {
  if (count > 0 && !p) return invalidArgument(function, name, "NULL with a non-zero count");
  return ncclSuccess;
}

ncclResult_t checkRank(const char* function, const char* name, int r, ncclComm_t comm) {
  if (r < 0 || r >= comm->nranks) {
    return invalidArgument(function, name,
                           std::to_string(r) + " is not a rank of this communicator (0 to " +
                               std::to_string(comm->nranks - 1) + ")");
  }
  return ncclSuccess;
}

/// Unsigned min/max run as signed min/max of the values with their top bit
/// flipped (which maps unsigned order onto signed order); sum and prod are
/// the same bits either way.
void flipTopBits(void* p, size_t count, size_t bytes) {
  if (bytes == 4) {
    auto* v = static_cast<uint32_t*>(p);
    for (size_t i = 0; i < count; ++i) v[i] ^= 0x80000000u;
  } else {
    auto* v = static_cast<uint64_t*>(p);
    for (size_t i = 0; i < count; ++i) v[i] ^= 0x8000000000000000ull;
  }
}

/// Starts a host reduction (allreduce, reduce or reduce-scatter).
Work submitReduction(ncclComm_t comm, Collective coll, const void* in, void* out, size_t count, DataType type,
                     ReduceOp op, int root) {
  switch (coll) {
    case Collective::kAllreduce: return comm->host.allreduce(in, out, count, type, op);
    case Collective::kReduce: return comm->host.reduce(in, out, count, type, op, root);
    default: return comm->host.reduceScatter(in, out, count, type, op);
  }
}

/// A host min or max of unsigned integers, as the signed reduction of
/// values with their top bits flipped. `inCount` is the input's element
/// count, `outCount` the output's.
HostCall flippedReduction(ncclComm_t comm, cudaStream_t stream, Collective coll, const void* in, void* out,
                          size_t count, size_t inCount, size_t outCount, const HostType& t, ReduceOp op, int root) {
  HostCall c;
  c.comm = comm;
  c.stream = stream;
  c.bytes = inCount * t.bytes;
  const bool writesOut = coll != Collective::kReduce || comm->rank == root;
  auto submit = [comm, coll, out, count, type = t.type, op, root](const void* input) {
    return submitReduction(comm, coll, input, out, count, type, op, root);
  };
  auto scratch = std::make_shared<std::vector<unsigned char>>();
  const size_t bytes = t.bytes;
  c.start = [submit, in, scratch, inCount, bytes] {
    scratch->resize(inCount * bytes);
    if (inCount) std::memcpy(scratch->data(), in, inCount * bytes);
    flipTopBits(scratch->data(), inCount, bytes);
    return submit(scratch->data());
  };
  c.finish = [scratch, out, outCount, bytes, writesOut] {
    if (writesOut && outCount) flipTopBits(out, outCount, bytes);
  };
  return c;
}

/// Runs `start` (returns the call's Work) now, or, inside a group, at
/// ncclGroupEnd.
template <typename Start>
ncclResult_t hostCollective(ncclComm_t comm, cudaStream_t stream, const char* fn, size_t bytes, Start start) {
  if (!inGroup()) return runNow(comm, stream, fn, start);
  HostCall c;
  c.comm = comm;
  c.stream = stream;
  c.bytes = bytes;
  c.start = std::move(start);
  return enqueue(std::move(c), fn);
}

ncclResult_t enqueueReduction(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                              Collective coll) {
  HostType t;
  if (auto r = hostType(datatype, fn, &t)) return r;
  ReduceOp rop;
  if (auto r = hostOp(op, t, datatype, fn, &rop)) return r;
  if (coll == Collective::kReduce) {
    if (auto r = checkRank(fn, "root", root, comm)) return r;
  }
  const size_t inCount = coll == Collective::kReduceScatter ? count * comm->nranks : count;
  if (coll == Collective::kReduceScatter && comm->nranks && count > std::numeric_limits<size_t>::max() / comm->nranks) {
    return invalidArgument(fn, "recvcount", std::to_string(count) + " elements per rank overflow the address space");
  }
  size_t total;
  if (auto r = checkSize(fn, inCount, t.bytes, &total)) return r;
  if (auto r = checkPointer(fn, "sendbuff", sendbuff, count)) return r;
  const bool needsOut = coll != Collective::kReduce || comm->rank == root;
  if (needsOut) {
    if (auto r = checkPointer(fn, "recvbuff", recvbuff, count)) return r;
  }
  const bool flip = t.isUnsigned && (rop == ReduceOp::kMin || rop == ReduceOp::kMax);
  if (flip && onDevice(sendbuff, recvbuff)) {
    return invalidArgument(fn, "op",
                           "min and max of unsigned integers on device buffers need the real NCCL, and this "
                           "communicator has none: " + comm->realWhy);
  }
  if (!flip) {
    return hostCollective(comm, stream, fn, total, [comm, coll, sendbuff, recvbuff, count, type = t.type, rop, root] {
      return submitReduction(comm, coll, sendbuff, recvbuff, count, type, rop, root);
    });
  }
  return enqueue(flippedReduction(comm, stream, coll, sendbuff, recvbuff, count, inCount, count, t, rop, root), fn);
}

}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclAllReduce";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      if (datatype == ncclFloat32 && (op == ncclSum || op == ncclAvg) && !inGroup()) {
        const ncclResult_t r = compressedDeviceAllReduce(sendbuff, recvbuff, count, op, comm, stream);
        if (r != ncclNumResults) return r;  // ncclNumResults: compression is off
      }
      return callReal(fn, GRADCOMM_REAL(ncclAllReduce), sendbuff, recvbuff, count, datatype, op, comm->real, stream);
    }
    return enqueueReduction(fn, sendbuff, recvbuff, count, datatype, op, 0, comm, stream, Collective::kAllreduce);
  });
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclReduce";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclReduce), sendbuff, recvbuff, count, datatype, op, root, comm->real, stream);
    }
    return enqueueReduction(fn, sendbuff, recvbuff, count, datatype, op, root, comm, stream, Collective::kReduce);
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclReduceScatter";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclReduceScatter), sendbuff, recvbuff, recvcount, datatype, op, comm->real,
                      stream);
    }
    return enqueueReduction(fn, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream,
                            Collective::kReduceScatter);
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclBroadcast";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclBroadcast), sendbuff, recvbuff, count, datatype, root, comm->real, stream);
    }
    HostType t;
    if (auto r = hostType(datatype, fn, &t)) return r;
    if (auto r = checkRank(fn, "root", root, comm)) return r;
    size_t total;
    if (auto r = checkSize(fn, count, t.bytes, &total)) return r;
    if (comm->rank == root) {
      if (auto r = checkPointer(fn, "sendbuff", sendbuff, count)) return r;
    }
    if (auto r = checkPointer(fn, "recvbuff", recvbuff, count)) return r;
    return hostCollective(comm, stream, fn, total, [comm, sendbuff, recvbuff, count, type = t.type, root] {
      return comm->host.broadcast(comm->rank == root ? sendbuff : recvbuff, recvbuff, count, type, root);
    });
  });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclAllGather";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclAllGather), sendbuff, recvbuff, sendcount, datatype, comm->real, stream);
    }
    HostType t;
    if (auto r = hostType(datatype, fn, &t)) return r;
    if (comm->nranks && sendcount > std::numeric_limits<size_t>::max() / comm->nranks) {
      return invalidArgument(fn, "sendcount", "overflows the address space");
    }
    size_t total;
    if (auto r = checkSize(fn, sendcount * comm->nranks, t.bytes, &total)) return r;
    if (auto r = checkPointer(fn, "sendbuff", sendbuff, sendcount)) return r;
    if (auto r = checkPointer(fn, "recvbuff", recvbuff, sendcount)) return r;
    return hostCollective(comm, stream, fn, total, [comm, sendbuff, recvbuff, sendcount, type = t.type] {
      return comm->host.allgather(sendbuff, recvbuff, sendcount, type);
    });
  });
}

// ---- point-to-point and the collectives built from it ----------------------------

namespace {

ncclResult_t hostTransferBytes(const char* fn, size_t count, ncclDataType_t datatype, size_t* bytes) {
  HostType t;
  if (auto r = hostType(datatype, fn, &t)) return r;
  return checkSize(fn, count, t.bytes, bytes);
}

HostTransfer transfer(ncclComm_t comm, cudaStream_t stream, bool send, int peer, const void* data, size_t bytes) {
  HostTransfer h;
  h.comm = comm;
  h.stream = stream;
  // NCCL matches sends to receives by bytes: they move as bytes here too.
  h.transfer = send ? gradcomm::Communicator::Transfer::send(data, bytes, DataType::kUInt8, peer)
                    : gradcomm::Communicator::Transfer::recv(const_cast<void*>(data), bytes, DataType::kUInt8, peer);
  return h;
}

/// The host half of ncclGather (`gather`) and ncclScatter: the root's
/// buffer holds a block of `count` elements per rank, in rank order; every
/// rank sends its block to the root (gather) or receives it from the root.
ncclResult_t hostRooted(const char* fn, bool gather, const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  size_t bytes, total;
  if (auto r = hostTransferBytes(fn, count, datatype, &bytes)) return r;
  if (auto r = checkSize(fn, bytes, comm->nranks, &total)) return r;
  if (auto r = checkRank(fn, "root", root, comm)) return r;
  if (auto r = gather ? checkPointer(fn, "sendbuff", sendbuff, count) : checkPointer(fn, "recvbuff", recvbuff, count)) {
    return r;
  }
  std::vector<HostTransfer> ts;
  if (gather) ts.push_back(transfer(comm, stream, true, root, sendbuff, bytes));
  if (comm->rank == root) {
    if (auto r = gather ? checkPointer(fn, "recvbuff", recvbuff, count) : checkPointer(fn, "sendbuff", sendbuff, count)) {
      return r;
    }
    for (int p = 0; p < comm->nranks; ++p) {
      const size_t at = static_cast<size_t>(p) * bytes;
      ts.push_back(gather ? transfer(comm, stream, false, p, static_cast<char*>(recvbuff) + at, bytes)
                          : transfer(comm, stream, true, p, static_cast<const char*>(sendbuff) + at, bytes));
    }
  }
  if (!gather) ts.push_back(transfer(comm, stream, false, root, recvbuff, bytes));
  return enqueue(std::move(ts), fn);
}

}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  static const char* fn = "ncclSend";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, nullptr) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclSend), sendbuff, count, datatype, peer, comm->real, stream);
    }
    size_t bytes;
    if (auto r = hostTransferBytes(fn, count, datatype, &bytes)) return r;
    if (auto r = checkRank(fn, "peer", peer, comm)) return r;
    if (auto r = checkPointer(fn, "sendbuff", sendbuff, count)) return r;
    return enqueue(transfer(comm, stream, true, peer, sendbuff, bytes), fn);
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  static const char* fn = "ncclRecv";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(recvbuff, nullptr) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclRecv), recvbuff, count, datatype, peer, comm->real, stream);
    }
    size_t bytes;
    if (auto r = hostTransferBytes(fn, count, datatype, &bytes)) return r;
    if (auto r = checkRank(fn, "peer", peer, comm)) return r;
    if (auto r = checkPointer(fn, "recvbuff", recvbuff, count)) return r;
    return enqueue(transfer(comm, stream, false, peer, recvbuff, bytes), fn);
  });
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclAlltoAll";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclAlltoAll), sendbuff, recvbuff, count, datatype, comm->real, stream);
    }
    size_t bytes, total;
    if (auto r = hostTransferBytes(fn, count, datatype, &bytes)) return r;
    if (auto r = checkSize(fn, bytes, comm->nranks, &total)) return r;
    if (auto r = checkPointer(fn, "sendbuff", sendbuff, count)) return r;
    if (auto r = checkPointer(fn, "recvbuff", recvbuff, count)) return r;
    std::vector<HostTransfer> ts;
    for (int p = 0; p < comm->nranks; ++p) {
      ts.push_back(transfer(comm, stream, true, p, static_cast<const char*>(sendbuff) + p * bytes, bytes));
      ts.push_back(transfer(comm, stream, false, p, static_cast<char*>(recvbuff) + p * bytes, bytes));
    }
    return enqueue(std::move(ts), fn);
  });
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclGather";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclGather), sendbuff, recvbuff, count, datatype, root, comm->real, stream);
    }
    return hostRooted(fn, true, sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  static const char* fn = "ncclScatter";
  return guarded(fn, [&]() -> ncclResult_t {
    if (auto r = checkComm(comm, fn)) return r;
    if (onDevice(sendbuff, recvbuff) && servedByRealNccl(comm, fn)) {
      return callReal(fn, GRADCOMM_REAL(ncclScatter), sendbuff, recvbuff, count, datatype, root, comm->real, stream);
    }
    return hostRooted(fn, false, sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

ncclResult_t ncclGroupStart() { return gradcomm::capi::groupStart(); }
ncclResult_t ncclGroupEnd() {
  return guarded("ncclGroupEnd", [] { return gradcomm::capi::groupEnd("ncclGroupEnd"); });
}
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  static const char* fn = "ncclGroupSimulateEnd";
  return guarded(fn, [&]() -> ncclResult_t {
    if (!simInfo) return invalidArgument(fn, "simInfo", "NULL");
    if (simInfo->magic != 0x74685283u) {
      return invalidArgument(fn, "simInfo", "not initialised with NCCL_SIM_INFO_INITIALIZER");
    }
    float us = 0;
    const ncclResult_t r = groupSimulateEnd(&us);
    simInfo->estimatedTime = us;
    return r;
  });
}

}  // extern "C"

GRADCOMM_NCCL_ALIAS(ncclAllReduce)
GRADCOMM_NCCL_ALIAS(ncclReduce)
GRADCOMM_NCCL_ALIAS(ncclReduceScatter)
GRADCOMM_NCCL_ALIAS(ncclBroadcast)
GRADCOMM_NCCL_ALIAS(ncclBcast)
GRADCOMM_NCCL_ALIAS(ncclAllGather)
GRADCOMM_NCCL_ALIAS(ncclSend)
GRADCOMM_NCCL_ALIAS(ncclRecv)
GRADCOMM_NCCL_ALIAS(ncclAlltoAll)
GRADCOMM_NCCL_ALIAS(ncclGather)
GRADCOMM_NCCL_ALIAS(ncclScatter)
GRADCOMM_NCCL_ALIAS(ncclGroupStart)
GRADCOMM_NCCL_ALIAS(ncclGroupEnd)
GRADCOMM_NCCL_ALIAS(ncclGroupSimulateEnd)
