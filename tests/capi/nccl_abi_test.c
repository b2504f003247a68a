/* An unmodified NCCL program: it includes only nccl.h (and libc) and links
 * -lnccl. The test suite runs it linked against libgradcomm_nccl.so, and
 * linked against a stub libnccl.so.2 (whose every function fails) with
 * LD_PRELOAD=libgradcomm_nccl.so, so passing proves the preload intercepts.
 *
 *   nccl_abi_test RANKS CASE     forks RANKS processes (1 to 8) running CASE:
 *                                collectives, group, badargs, split, killed
 *   nccl_abi_test 1 initall      one process, ncclCommInitAll of 3 ranks
 *
 * The highest rank creates the unique id (so the id's creator is not rank
 * 0) and passes it to the others through a file. Every check compares the
 * exact values the reference computes; every wait is bounded. */
#include <nccl.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int gRank = -1, gRanks = 0, gFailures = 0;

static void failf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: FAIL: ", gRank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  ++gFailures;
}

#define CHECK_OK(call)                                                                           \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      failf("%s:%d %s returned %d (%s): %s", __FILE__, __LINE__, #call, (int)r_,                 \
            ncclGetErrorString(r_), ncclGetLastError(NULL));                                     \
      return;                                                                                    \
    }                                                                                            \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- element types ----------------------------------------------------------------- */

static const ncclDataType_t kTypes[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,     ncclInt64,     ncclUint64,
                                        ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
static const int kNumTypes = sizeof kTypes / sizeof kTypes[0];
static const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};

static size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
static int isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}
static int isFp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }
static int isUnsignedType(ncclDataType_t t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }

/* Small integers are exact in every float type; these conversions only
 * need to be right for them. */
static uint16_t toHalf(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  if (v < 0) v = -v;
  int e = 0;
  while (v >= 2) { v /= 2; ++e; }
  while (v < 1) { v *= 2; --e; }
  return sign | (uint16_t)((e + 15) << 10) | (uint16_t)((v - 1) * 1024);
}
static double fromHalf(uint16_t h) {
  int e = (h >> 10) & 31;
  double m = (h & 1023) / 1024.0;
  double v = e == 0 ? m * (1.0 / 16384) : (1 + m) * (e >= 15 ? (double)(1 << (e - 15)) : 1.0 / (1 << (15 - e)));
  return h & 0x8000 ? -v : v;
}
static uint16_t toBf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static double fromBf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element i of buf as the integer (two's complement, width bits) or float value. */
static void put(ncclDataType_t t, void* buf, size_t i, int64_t v) {
  char* p = (char*)buf + i * typeSize(t);
  switch (t) {
    case ncclFloat16: { uint16_t h = toHalf((double)v); memcpy(p, &h, 2); break; }
    case ncclBfloat16: { uint16_t h = toBf16((double)v); memcpy(p, &h, 2); break; }
    case ncclFloat32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case ncclFloat64: { double d = (double)v; memcpy(p, &d, 8); break; }
    default: memcpy(p, &v, typeSize(t));  /* little-endian: the low bytes */
  }
}
static double getFloat(ncclDataType_t t, const void* buf, size_t i) {
  const char* p = (const char*)buf + i * typeSize(t);
  uint16_t h;
  float f;
  double d;
  switch (t) {
    case ncclFloat16: memcpy(&h, p, 2); return fromHalf(h);
    case ncclBfloat16: memcpy(&h, p, 2); return fromBf16(h);
    case ncclFloat32: memcpy(&f, p, 4); return f;
    default: memcpy(&d, p, 8); return d;
  }
}
static uint64_t mask(ncclDataType_t t) {
  size_t s = typeSize(t);
  return s == 8 ? ~0ull : ((1ull << (8 * s)) - 1);
}
static uint64_t getBits(ncclDataType_t t, const void* buf, size_t i) {
  uint64_t u = 0;
  memcpy(&u, (const char*)buf + i * typeSize(t), typeSize(t));
  return u;
}
/* Signed value of width-bit two's complement bits. */
static int64_t signExtend(ncclDataType_t t, uint64_t u) {
  size_t bits = 8 * typeSize(t);
  if (bits == 64) return (int64_t)u;
  uint64_t sign = 1ull << (bits - 1);
  return (int64_t)((u ^ sign) - sign);
}

/* The value rank r contributes at element i for op (see the reference). */
static int64_t value(int r, size_t i, int op, int n) {
  if (op == ncclProd) {
    static const int64_t pick[] = {1, 2, -1, 1, 1};
    return pick[(i * 7 + (size_t)r * 3) % 5];
  }
  int64_t base = (int64_t)((i * 5 + 3) % 7) - 3;
  if (op == ncclAvg) {
    /* contributions sum to n * base exactly, so the average is base */
    int64_t c = r < n - 1 ? r : -(int64_t)(n - 1) * (n - 2) / 2;
    return base + c;
  }
  return base + (int64_t)((r * 3 + i) % 5) - 2;
}

/* The exact result of op over every rank at element i, as bits of t. */
static void reference(ncclDataType_t t, int op, size_t i, int n, void* out, size_t at) {
  if (isFloat(t)) {
    double acc = (double)value(0, i, op, n);
    for (int r = 1; r < n; ++r) {
      double v = (double)value(r, i, op, n);
      if (op == ncclSum || op == ncclAvg) acc += v;
      else if (op == ncclProd) acc *= v;
      else if (op == ncclMax) acc = v > acc ? v : acc;
      else acc = v < acc ? v : acc;
    }
    if (op == ncclAvg) acc /= n;
    put(t, out, at, (int64_t)acc);
    return;
  }
  uint64_t m = mask(t);
  uint64_t acc = (uint64_t)value(0, i, op, n) & m;
  for (int r = 1; r < n; ++r) {
    uint64_t v = (uint64_t)value(r, i, op, n) & m;
    if (op == ncclSum) acc = (acc + v) & m;
    else if (op == ncclProd) acc = (acc * v) & m;
    else {
      int greater = isUnsignedType(t) ? v > acc : signExtend(t, v) > signExtend(t, acc);
      if ((op == ncclMax) == greater) acc = v;
    }
  }
  memcpy((char*)out + at * typeSize(t), &acc, typeSize(t));
}

static int sameElement(ncclDataType_t t, const void* a, const void* b, size_t i) {
  if (isFloat(t)) return getFloat(t, a, i) == getFloat(t, b, i);
  return getBits(t, a, i) == getBits(t, b, i);
}

static void compare(const char* what, ncclDataType_t t, int op, size_t count, const void* got, const void* want) {
  for (size_t i = 0; i < count; ++i) {
    if (!sameElement(t, got, want, i)) {
      failf("%s type %d op %s count %zu: element %zu is %g (bits %llx), expected %g (bits %llx)", what, (int)t,
            op >= 0 ? kOpNames[op] : "-", count, i, isFloat(t) ? getFloat(t, got, i) : (double)getBits(t, got, i),
            (unsigned long long)getBits(t, got, i), isFloat(t) ? getFloat(t, want, i) : (double)getBits(t, want, i),
            (unsigned long long)getBits(t, want, i));
      return;
    }
  }
}

/* ---- cases ------------------------------------------------------------------------------- */

static void* alloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
  memset(p, 0x5a, bytes);  /* poison: every element must be written */
  return p;
}

static void reductions(ncclComm_t comm, ncclDataType_t t, int op, size_t count) {
  const int n = gRanks, me = gRank;
  const size_t es = typeSize(t);
  void* in = alloc(count * es * n);
  void* out = alloc(count * es * n);
  void* want = alloc(count * es * n);
  for (size_t i = 0; i < count; ++i) put(t, in, i, value(me, i, op, n));
  for (size_t i = 0; i < count; ++i) reference(t, op, i, n, want, i);

  CHECK_OK(ncclAllReduce(in, out, count, t, (ncclRedOp_t)op, comm, NULL));
  compare("allreduce", t, op, count, out, want);
  memcpy(out, in, count * es);
  CHECK_OK(ncclAllReduce(out, out, count, t, (ncclRedOp_t)op, comm, NULL));
  compare("allreduce in place", t, op, count, out, want);

  const int root = (int)(count % n);
  memset(out, 0x5a, count * es);
  CHECK_OK(ncclReduce(in, out, count, t, (ncclRedOp_t)op, root, comm, NULL));
  if (me == root) compare("reduce", t, op, count, out, want);

  /* reduce-scatter: block b of rank r's input holds value(r, b*count + i) */
  for (size_t i = 0; i < count * n; ++i) put(t, in, i, value(me, i, op, n));
  memset(out, 0x5a, count * es);
  CHECK_OK(ncclReduceScatter(in, out, count, t, (ncclRedOp_t)op, comm, NULL));
  for (size_t i = 0; i < count; ++i) reference(t, op, me * count + i, n, want, i);
  compare("reduce-scatter", t, op, count, out, want);
  free(in);
  free(out);
  free(want);
}

static void movements(ncclComm_t comm, ncclDataType_t t, size_t count) {
  const int n = gRanks, me = gRank;
  const size_t es = typeSize(t);
  unsigned char* in = alloc(count * es * n);
  unsigned char* out = alloc(count * es * n);
  unsigned char* want = alloc(count * es * n);
  /* raw bytes (fp8 has no arithmetic here): byte k of rank r's block b */
#define BYTE(r, b, k) ((unsigned char)((r) * 37 + (b) * 11 + (k) * 7 + 1))
  for (int root = 0; root < n; root += (n > 2 ? 2 : 1)) {
    for (size_t k = 0; k < count * es; ++k) in[k] = BYTE(me, 0, k);
    memset(out, 0x5a, count * es);
    CHECK_OK(ncclBroadcast(in, out, count, t, root, comm, NULL));
    for (size_t k = 0; k < count * es; ++k) want[k] = BYTE(root, 0, k);
    if (memcmp(out, want, count * es)) failf("broadcast type %d root %d count %zu: wrong bytes", (int)t, root, count);
    memcpy(out, in, count * es);
    CHECK_OK(ncclBcast(out, count, t, root, comm, NULL));
    if (memcmp(out, want, count * es)) failf("bcast type %d root %d count %zu: wrong bytes", (int)t, root, count);
  }
  memset(out, 0x5a, count * es * n);
  CHECK_OK(ncclAllGather(in, out, count, t, comm, NULL));
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < count * es; ++k) want[r * count * es + k] = BYTE(r, 0, k);
  if (memcmp(out, want, count * es * n)) failf("allgather type %d count %zu: wrong bytes", (int)t, count);

  /* all-to-all: block b of rank r goes to rank b */
  for (int b = 0; b < n; ++b)
    for (size_t k = 0; k < count * es; ++k) in[b * count * es + k] = BYTE(me, b, k);
  memset(out, 0x5a, count * es * n);
  CHECK_OK(ncclAlltoAll(in, out, count, t, comm, NULL));
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < count * es; ++k) want[r * count * es + k] = BYTE(r, me, k);
  if (memcmp(out, want, count * es * n)) failf("alltoall type %d count %zu: wrong bytes", (int)t, count);

  const int root = n - 1;
  memset(out, 0x5a, count * es * n);
  CHECK_OK(ncclGather(in, out, count, t, root, comm, NULL));
  if (me == root) {
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < count * es; ++k) want[r * count * es + k] = BYTE(r, 0, k);
    if (memcmp(out, want, count * es * n)) failf("gather type %d count %zu: wrong bytes", (int)t, count);
  }
  memset(out, 0x5a, count * es);
  CHECK_OK(ncclScatter(in, out, count, t, root, comm, NULL));
  for (size_t k = 0; k < count * es; ++k) want[k] = BYTE(root, me, k);
  if (memcmp(out, want, count * es)) failf("scatter type %d count %zu: wrong bytes", (int)t, count);
  free(in);
  free(out);
  free(want);
}

static void caseCollectives(ncclComm_t comm) {
  static const size_t counts[] = {0, 1, 7, 1031};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
    for (int ti = 0; ti < kNumTypes; ++ti) {
      ncclDataType_t t = kTypes[ti];
      movements(comm, t, counts[c]);
      if (isFp8(t)) continue;
      for (int op = 0; op < 5; ++op) {
        if (op == ncclAvg && !isFloat(t)) continue;
        reductions(comm, t, op, counts[c]);
      }
    }
  }
  /* larger than a pipeline segment */
  for (int op = 0; op < 5; ++op) reductions(comm, ncclFloat32, op, 262147);
  reductions(comm, ncclUint32, ncclMax, 100003);
}

static void caseGroup(ncclComm_t comm) {
  const int n = gRanks, me = gRank;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  enum { kCount = 4099 };
  float* a = alloc(kCount * 4);
  float* b = alloc(kCount * 4);
  int32_t* sendA = alloc(kCount * 4);
  int32_t* recvA = alloc(kCount * 4);
  int64_t* sendB = alloc(17 * 8);
  int64_t* recvB = alloc(17 * 8);
  int32_t self[5] = {me, me + 1, me + 2, me + 3, me + 4}, selfOut[5] = {0};
  for (int i = 0; i < kCount; ++i) {
    a[i] = (float)(me + i % 5);
    b[i] = me == 0 ? (float)(i % 13) : -1.0f;
    sendA[i] = me * 100000 + i;
  }
  for (int i = 0; i < 17; ++i) sendB[i] = (int64_t)me << 40 | i;

  /* several collectives and a ring of send/recv pairs in one (nested) group */
  CHECK_OK(ncclGroupStart());
  CHECK_OK(ncclAllReduce(a, a, kCount, ncclFloat32, ncclSum, comm, NULL));
  CHECK_OK(ncclGroupStart());
  CHECK_OK(ncclBroadcast(b, b, kCount, ncclFloat32, 0, comm, NULL));
  CHECK_OK(ncclRecv(recvA, kCount, ncclInt32, prev, comm, NULL));
  CHECK_OK(ncclGroupEnd());
  CHECK_OK(ncclSend(sendA, kCount, ncclInt32, next, comm, NULL));
  CHECK_OK(ncclSend(sendB, 17, ncclInt64, prev, comm, NULL));
  CHECK_OK(ncclRecv(recvB, 17, ncclInt64, next, comm, NULL));
  CHECK_OK(ncclSend(self, 5, ncclInt32, me, comm, NULL));
  CHECK_OK(ncclRecv(selfOut, 5, ncclInt32, me, comm, NULL));
  CHECK_OK(ncclGroupEnd());
  for (int i = 0; i < kCount; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += (float)(r + i % 5);
    if (a[i] != want) { failf("group allreduce element %d: %g, expected %g", i, a[i], want); break; }
    if (b[i] != (float)(i % 13)) { failf("group broadcast element %d: %g", i, b[i]); break; }
    if (recvA[i] != prev * 100000 + i) { failf("group recv from %d element %d: %d", prev, i, recvA[i]); break; }
  }
  for (int i = 0; i < 17; ++i) {
    if (recvB[i] != ((int64_t)next << 40 | i)) { failf("group recv from %d element %d wrong", next, i); break; }
  }
  for (int i = 0; i < 5; ++i) {
    if (selfOut[i] != me + i) { failf("send/recv to self element %d: %d", i, selfOut[i]); break; }
  }

  /* send/recv outside a group, ordered so that nobody waits forever */
  int32_t token = me * 7 + 1, got = -1;
  if (n > 1) {
    if (me % 2 == 0) {
      CHECK_OK(ncclSend(&token, 1, ncclInt32, next, comm, NULL));
      if (!(me == 0 && n % 2 == 1)) CHECK_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, NULL));
    } else {
      CHECK_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, NULL));
      CHECK_OK(ncclSend(&token, 1, ncclInt32, next, comm, NULL));
    }
    if (me == 0 && n % 2 == 1) CHECK_OK(ncclRecv(&got, 1, ncclInt32, prev, comm, NULL));
    if (got != prev * 7 + 1) failf("ungrouped recv from %d: %d", prev, got);
  }

  /* a simulated group runs nothing and uses nothing up */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  float c = 5.0f;
  CHECK_OK(ncclGroupStart());
  CHECK_OK(ncclAllReduce(&c, &c, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK_OK(ncclGroupSimulateEnd(&sim));
  if (c != 5.0f) failf("ncclGroupSimulateEnd ran the allreduce");
  if (!(sim.estimatedTime > 0)) failf("ncclGroupSimulateEnd estimated %g", sim.estimatedTime);
  CHECK_OK(ncclAllReduce(&c, &c, 1, ncclFloat32, ncclSum, comm, NULL));
  if (c != 5.0f * n) failf("allreduce after a simulated group: %g", c);

  ncclResult_t r = ncclGroupEnd();
  if (r != ncclInvalidUsage) failf("ncclGroupEnd without a group returned %d", (int)r);
  free(a); free(b); free(sendA); free(recvA); free(sendB); free(recvB);
}

static void expectInvalid(const char* what, ncclResult_t r, const char* argument) {
  const char* text = ncclGetLastError(NULL);
  if (r != ncclInvalidArgument) {
    failf("%s returned %d, expected ncclInvalidArgument (%d)", what, (int)r, (int)ncclInvalidArgument);
  } else if (!text || !strstr(text, argument)) {
    failf("%s: last error '%s' does not name '%s'", what, text ? text : "(null)", argument);
  }
}

static void caseBadArgs(ncclComm_t comm) {
  float x[4] = {1, 2, 3, 4};
  int32_t i4[4] = {1, 2, 3, 4};
  expectInvalid("datatype 99", ncclAllReduce(x, x, 4, (ncclDataType_t)99, ncclSum, comm, NULL), "datatype");
  expectInvalid("op 42", ncclAllReduce(x, x, 4, ncclFloat32, (ncclRedOp_t)42, comm, NULL), "op");
  expectInvalid("root out of range", ncclReduce(x, x, 4, ncclFloat32, ncclSum, gRanks, comm, NULL), "root");
  expectInvalid("broadcast root -1", ncclBroadcast(x, x, 4, ncclFloat32, -1, comm, NULL), "root");
  expectInvalid("peer -1", ncclSend(x, 4, ncclFloat32, -1, comm, NULL), "peer");
  expectInvalid("peer = nranks", ncclRecv(x, 4, ncclFloat32, gRanks, comm, NULL), "peer");
  expectInvalid("NULL sendbuff", ncclAllReduce(NULL, x, 4, ncclFloat32, ncclSum, comm, NULL), "sendbuff");
  expectInvalid("NULL recvbuff", ncclAllGather(x, NULL, 1, ncclFloat32, comm, NULL), "recvbuff");
  expectInvalid("gather root = nranks", ncclGather(x, x, 1, ncclFloat32, gRanks, comm, NULL), "root");
  expectInvalid("gather NULL sendbuff", ncclGather(NULL, x, 1, ncclFloat32, 0, comm, NULL), "sendbuff");
  expectInvalid("scatter root -1", ncclScatter(x, x, 1, ncclFloat32, -1, comm, NULL), "root");
  expectInvalid("scatter NULL recvbuff", ncclScatter(x, NULL, 1, ncclFloat32, 0, comm, NULL), "recvbuff");
  expectInvalid("NULL comm", ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, NULL, NULL), "comm");
  expectInvalid("fp8 sum", ncclAllReduce(x, x, 4, ncclFloat8e4m3, ncclSum, comm, NULL), "datatype");
  expectInvalid("avg on int32", ncclAllReduce(i4, i4, 4, ncclInt32, ncclAvg, comm, NULL), "op");
  expectInvalid("count overflow", ncclAllReduce(x, x, (size_t)-1 / 2, ncclFloat64, ncclSum, comm, NULL), "count");
  expectInvalid("ncclCommCount(NULL)", ncclCommCount(comm, NULL), "count");
  expectInvalid("ncclGetVersion(NULL)", ncclGetVersion(NULL), "version");
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  ncclComm_t other = NULL;
  expectInvalid("zero unique id", ncclCommInitRank(&other, 2, zero, 0), "commId");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  expectInvalid("rank >= nranks", ncclCommInitRank(&other, 2, id, 2), "rank");
  ncclConfig_t config;
  memset(&config, 0, sizeof config);
  expectInvalid("config without initializer", ncclCommInitRankConfig(&other, 1, id, 0, &config), "config");
  if (ncclGetErrorString(ncclInvalidArgument) == NULL || !*ncclGetErrorString(ncclRemoteError)) {
    failf("ncclGetErrorString returned nothing");
  }
  /* none of that broke the communicator */
  float y = (float)gRank;
  CHECK_OK(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  if (y != (float)(gRanks * (gRanks - 1) / 2)) failf("allreduce after bad arguments: %g", y);
  ncclResult_t async = ncclInternalError;
  CHECK_OK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) failf("async error %d after bad arguments", (int)async);
  int version = 0;
  CHECK_OK(ncclGetVersion(&version));
  if (version != NCCL_VERSION_CODE) failf("ncclGetVersion: %d, header %d", version, NCCL_VERSION_CODE);
}

static void caseSplit(ncclComm_t comm) {
  ncclComm_t half = NULL;
  /* colors by parity, keys reversed: new rank order is the reverse of the old */
  CHECK_OK(ncclCommSplit(comm, gRank % 2, -gRank, &half, NULL));
  int size = 0, rank = -1;
  CHECK_OK(ncclCommCount(half, &size));
  CHECK_OK(ncclCommUserRank(half, &rank));
  int members = (gRanks - gRank % 2 + 1) / 2;
  if (size != members) failf("split: %d ranks, expected %d", size, members);
  int64_t v = gRank, sum = 0;
  for (int r = gRank % 2; r < gRanks; r += 2) sum += r;
  CHECK_OK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, half, NULL));
  if (v != sum) failf("split allreduce: %lld, expected %lld", (long long)v, (long long)sum);
  int64_t first = gRank;
  CHECK_OK(ncclBroadcast(&first, &first, 1, ncclInt64, 0, half, NULL));
  /* new rank 0 is the old rank with the largest key order: the highest old rank of the color */
  int highest = gRank % 2;
  for (int r = gRank % 2; r < gRanks; r += 2) highest = r;
  if (first != highest) failf("split rank 0 is old rank %lld, expected %d", (long long)first, highest);
  ncclComm_t none = (ncclComm_t)0x1;
  CHECK_OK(ncclCommSplit(comm, gRank == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &none, NULL));
  if (gRank == 0 && none != NULL) failf("NCCL_SPLIT_NOCOLOR gave a communicator");
  if (none && gRank != 0) CHECK_OK(ncclCommDestroy(none));
  CHECK_OK(ncclCommDestroy(half));
  /* the parent still works */
  float y = 1;
  CHECK_OK(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  if (y != (float)gRanks) failf("parent allreduce after split: %g", y);
}

static void caseKilled(ncclComm_t comm) {
  if (gRanks < 2) { failf("the killed-peer case needs at least 2 ranks"); return; }
  float y = 1;
  CHECK_OK(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  if (gRank == gRanks - 1) raise(SIGKILL);  /* this rank dies between two collectives */
  enum { kCount = 1 << 20 };
  float* big = alloc(kCount * 4);
  for (int i = 0; i < kCount; ++i) big[i] = 1;
  const double t0 = now();
  ncclResult_t r = ncclAllReduce(big, big, kCount, ncclFloat32, ncclSum, comm, NULL);
  const double took = now() - t0;
  if (r != ncclRemoteError) failf("allreduce with a dead peer returned %d (%s), expected ncclRemoteError", (int)r,
                                  ncclGetLastError(NULL));
  if (took > 15) failf("the dead peer took %.1f s to notice (GRADCOMM_TIMEOUT=10s)", took);
  ncclResult_t async = ncclSuccess;
  CHECK_OK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclRemoteError) failf("ncclCommGetAsyncError after a dead peer: %d", (int)async);
  r = ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  if (r != ncclRemoteError) failf("the next call after a dead peer returned %d", (int)r);
  fprintf(stderr, "rank %d: dead peer reported in %.2f s: %s\n", gRank, took, ncclGetLastError(NULL));
  free(big);
}

/* ncclCommInitAll: several ranks in one process, driven from one thread
 * through groups. */
static int caseInitAll(void) {
  enum { kDevs = 3, kCount = 1000 };
  ncclComm_t comms[kDevs];
  gRank = 0;
  gRanks = kDevs;
  if (ncclCommInitAll(comms, kDevs, NULL) != ncclSuccess) {
    failf("ncclCommInitAll: %s", ncclGetLastError(NULL));
    return 1;
  }
  static double buf[kDevs][kCount];
  for (int d = 0; d < kDevs; ++d)
    for (int i = 0; i < kCount; ++i) buf[d][i] = d * 10 + i;
  if (ncclGroupStart() != ncclSuccess) failf("group start");
  for (int d = 0; d < kDevs; ++d) ncclAllReduce(buf[d], buf[d], kCount, ncclFloat64, ncclMax, comms[d], NULL);
  if (ncclGroupEnd() != ncclSuccess) failf("ncclCommInitAll group: %s", ncclGetLastError(NULL));
  for (int d = 0; d < kDevs; ++d)
    for (int i = 0; i < kCount; ++i)
      if (buf[d][i] != (kDevs - 1) * 10 + i) { failf("initall element %d of %d: %g", i, d, buf[d][i]); break; }
  for (int d = 0; d < kDevs; ++d) ncclCommDestroy(comms[d]);
  return gFailures ? 1 : 0;
}

/* ---- processes ---------------------------------------------------------------------------- */

static int child(int rank, int ranks, const char* idFile, const char* which) {
  gRank = rank;
  gRanks = ranks;
  ncclUniqueId id;
  if (rank == ranks - 1) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      failf("ncclGetUniqueId returned %d: %s", (int)r, ncclGetLastError(NULL));
      return 1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", idFile);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, idFile) != 0) {
      failf("cannot write %s: %s", idFile, strerror(errno));
      return 1;
    }
  } else {
    const double end = now() + 30;
    FILE* f = NULL;
    while (!(f = fopen(idFile, "rb"))) {
      if (now() > end) { failf("no unique id in %s after 30 s", idFile); return 1; }
      usleep(10000);
    }
    size_t got = fread(&id, sizeof id, 1, f);
    fclose(f);
    if (got != 1) { failf("short unique id file"); return 1; }
  }
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, ranks, id, rank);
  if (r != ncclSuccess) {
    failf("ncclCommInitRank returned %d: %s", (int)r, ncclGetLastError(NULL));
    return 1;
  }
  int n = 0, me = -1;
  if (ncclCommCount(comm, &n) != ncclSuccess || n != ranks) failf("ncclCommCount: %d", n);
  if (ncclCommUserRank(comm, &me) != ncclSuccess || me != rank) failf("ncclCommUserRank: %d", me);
  const double t0 = now();
  if (!strcmp(which, "collectives")) caseCollectives(comm);
  else if (!strcmp(which, "group")) caseGroup(comm);
  else if (!strcmp(which, "badargs")) caseBadArgs(comm);
  else if (!strcmp(which, "split")) caseSplit(comm);
  else if (!strcmp(which, "killed")) caseKilled(comm);
  else failf("unknown case %s", which);
  if (ncclCommDestroy(comm) != ncclSuccess) failf("ncclCommDestroy: %s", ncclGetLastError(NULL));
  fprintf(stderr, "rank %d/%d: %s %s in %.2f s\n", rank, ranks, which, gFailures ? "FAILED" : "passed", now() - t0);
  return gFailures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && !strcmp(argv[1], "--child")) return child(atoi(argv[2]), atoi(argv[3]), argv[4], argv[5]);
  if (argc != 3) {
    fprintf(stderr, "usage: %s RANKS collectives|group|badargs|split|killed|initall\n", argv[0]);
    return 2;
  }
  const int ranks = atoi(argv[1]);
  const char* which = argv[2];
  if (!strcmp(which, "initall")) return caseInitAll();
  if (ranks < 1 || ranks > 8) { fprintf(stderr, "RANKS must be 1 to 8\n"); return 2; }
  char dir[] = "/tmp/nccl_abi_test.XXXXXX";
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
  char idFile[4096];
  snprintf(idFile, sizeof idFile, "%s/id", dir);
  pid_t pids[8];
  for (int r = 0; r < ranks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char rs[16], ns[16];
      snprintf(rs, sizeof rs, "%d", r);
      snprintf(ns, sizeof ns, "%d", ranks);
      execl("/proc/self/exe", argv[0], "--child", rs, ns, idFile, which, (char*)NULL);
      _exit(127);
    }
  }
  /* Bounded: every rank must finish within the limit, or all are killed. */
  const double end = now() + 240;
  int status[8], done = 0, bad = 0;
  for (int r = 0; r < ranks; ++r) status[r] = -1;
  while (done < ranks) {
    for (int r = 0; r < ranks; ++r) {
      if (status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) { status[r] = st; ++done; }
    }
    if (done < ranks && now() > end) {
      fprintf(stderr, "FAIL: ranks still running after 240 s; killing them\n");
      for (int r = 0; r < ranks; ++r) if (status[r] == -1) kill(pids[r], SIGKILL);
      bad = 1;
    }
    usleep(5000);
  }
  for (int r = 0; r < ranks; ++r) {
    const int killedRank = !strcmp(which, "killed") && ranks > 1 && r == ranks - 1;
    if (killedRank) {
      if (!(WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL)) {
        fprintf(stderr, "FAIL: rank %d was to die by SIGKILL\n", r);
        bad = 1;
      }
    } else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      fprintf(stderr, "FAIL: rank %d exited with status %d\n", r, status[r]);
      bad = 1;
    }
  }
  unlink(idFile);
  rmdir(dir);
  printf("%s on %d ranks: %s\n", which, ranks, bad ? "FAILED" : "passed");
  return bad;
}
