/* The NCCL-ABI library on device buffers (one GPU): with one rank, every call
 * goes to the real NCCL behind gradcomm's communicator; with
 * GRADCOMM_COMPRESSION=fp16 or bf16 a float32 allreduce runs gradcomm's
 * cast kernels around a half-precision allreduce. Exits 77 (skipped) where
 * no GPU works. Also times ncclAllReduce through the shim against the real
 * NCCL called directly (its own communicator, dlopen'ed), for gpu-check.
 * Last, two processes on the one GPU (this one and a copy of it started
 * with --shared-gpu-child ID): the real NCCL refuses them, so the shim forms
 * without it and serves their device collectives and send/recv itself. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(cond, ...)                        \
  do {                                          \
    if (!(cond)) {                              \
      fprintf(stderr, "FAIL: " __VA_ARGS__);    \
      fprintf(stderr, "\n");                    \
      ++failures;                               \
    }                                           \
  } while (0)
#define NCCL_OK(call)                                                                                \
  do {                                                                                               \
    ncclResult_t r_ = (call);                                                                        \
    if (r_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "FAIL: %s: %d %s\n", #call, (int)r_, ncclGetLastError(NULL));                  \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)
#define CUDA_OK(call)                                                                                \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    if (e_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "FAIL: %s: %s\n", #call, cudaGetErrorString(e_));                              \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef ncclResult_t (*GetIdFn)(ncclUniqueId*);
typedef ncclResult_t (*InitFn)(ncclComm_t*, int, ncclUniqueId, int);
typedef ncclResult_t (*AllReduceFn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);

/* Median-free but warm: per-call microseconds of `iters` back-to-back calls. */
static double timeCalls(AllReduceFn f, void* buf, size_t count, ncclComm_t comm, cudaStream_t s, int iters) {
  for (int i = 0; i < 5; ++i) f(buf, buf, count, ncclFloat32, ncclSum, comm, s);
  cudaStreamSynchronize(s);
  double t0 = now();
  for (int i = 0; i < iters; ++i) f(buf, buf, count, ncclFloat32, ncclSum, comm, s);
  cudaStreamSynchronize(s);
  return (now() - t0) * 1e6 / iters;
}

/* Rank `rank` of two processes sharing GPU 0: ncclCommInitRank succeeds
 * without the real NCCL, and a device allreduce and a device send/recv
 * pair are exact. Returns the failures. */
static int sharedGpuRank(int rank, const ncclUniqueId* id) {
  enum { kCount = 1 << 16 };
  int before = failures;
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 2, *id, rank));
  int dev = -1;
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  CHECK(dev == 0, "rank %d: ncclCommCuDevice gave %d, not 0", rank, dev);
  float* h = malloc(kCount * sizeof(float));
  for (int i = 0; i < kCount; ++i) h[i] = (float)((i % 89) - 44) * (float)(rank + 1);
  float* x = NULL;
  CUDA_OK(cudaMalloc((void**)&x, kCount * sizeof(float)));
  CUDA_OK(cudaMemcpy(x, h, kCount * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  NCCL_OK(ncclAllReduce(x, x, kCount, ncclFloat32, ncclSum, comm, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(h, x, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < kCount && !bad; ++i) bad = h[i] != (float)((i % 89) - 44) * 3.0f;
  CHECK(!bad, "two processes sharing the GPU: rank %d's device allreduce is wrong", rank);
  /* each rank's original values to the other, on device buffers */
  for (int i = 0; i < kCount; ++i) h[i] = (float)((i % 89) - 44) * (float)(rank + 1);
  float* y = NULL;
  CUDA_OK(cudaMalloc((void**)&y, kCount * sizeof(float)));
  CUDA_OK(cudaMemcpy(x, h, kCount * sizeof(float), cudaMemcpyHostToDevice));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(x, kCount, ncclFloat32, 1 - rank, comm, s));
  NCCL_OK(ncclRecv(y, kCount, ncclFloat32, 1 - rank, comm, s));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(h, y, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  bad = 0;
  for (int i = 0; i < kCount && !bad; ++i) bad = h[i] != (float)((i % 89) - 44) * (float)(2 - rank);
  CHECK(!bad, "two processes sharing the GPU: rank %d's device send/recv is wrong", rank);
  cudaFree(y);
  cudaFree(x);
  free(h);
  cudaStreamDestroy(s);
  NCCL_OK(ncclCommDestroy(comm));
  return failures - before;
}

int main(int argc, char** argv) {
  if (argc == 3 && !strcmp(argv[1], "--shared-gpu-child")) {
    ncclUniqueId id;
    if (strlen(argv[2]) != 2 * sizeof id.internal) return 2;
    for (size_t i = 0; i < sizeof id.internal; ++i) {
      unsigned v = 0;
      sscanf(argv[2] + 2 * i, "%2x", &v);
      id.internal[i] = (char)v;
    }
    return sharedGpuRank(1, &id) ? 1 : 0;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no GPU works here: skipped\n");
    return 77;
  }
  enum { kCount = 1 << 20 };
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  int dev = -1;
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  CHECK(dev >= 0, "ncclCommCuDevice gave %d: the real NCCL's communicator is missing", dev);

  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  float *d = NULL, *e = NULL;
  CUDA_OK(cudaMalloc((void**)&d, kCount * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&e, kCount * sizeof(float)));
  float* h = malloc(kCount * sizeof(float));
  float* back = malloc(kCount * sizeof(float));
  /* small integers and halves: exact in fp16 and bf16 too */
  for (int i = 0; i < kCount; ++i) h[i] = (float)((i % 97) - 48) * 0.5f;
  CUDA_OK(cudaMemcpy(d, h, kCount * sizeof(float), cudaMemcpyHostToDevice));

  NCCL_OK(ncclAllReduce(d, e, kCount, ncclFloat32, ncclSum, comm, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(back, e, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(!memcmp(back, h, kCount * sizeof(float)), "device allreduce on one rank changed the data");

  NCCL_OK(ncclBroadcast(d, e, kCount, ncclFloat32, 0, comm, s));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(d, kCount, ncclFloat32, 0, comm, s));
  NCCL_OK(ncclRecv(e, kCount, ncclFloat32, 0, comm, s));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaMemcpy(back, e, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(!memcmp(back, h, kCount * sizeof(float)), "device send/recv to self changed the data");

  /* the same communicator still serves host buffers itself */
  float hx = 3.0f;
  NCCL_OK(ncclAllReduce(&hx, &hx, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(hx == 3.0f, "host allreduce on a device communicator gave %g", hx);

  const char* compression = getenv("GRADCOMM_COMPRESSION");
  printf("device collectives through the shim: %s (GRADCOMM_COMPRESSION=%s)\n", failures ? "FAILED" : "exact",
         compression ? compression : "none");

  /* shim overhead on device buffers: the same allreduce on the real NCCL directly */
  const char* path = getenv("GRADCOMM_NCCL_LIB");
  void* real = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (real) {
    GetIdFn getId = (GetIdFn)dlsym(real, "ncclGetUniqueId");
    InitFn init = (InitFn)dlsym(real, "ncclCommInitRank");
    AllReduceFn realAllReduce = (AllReduceFn)dlsym(real, "ncclAllReduce");
    ncclUniqueId rid;
    ncclComm_t rcomm;
    if (getId && init && realAllReduce && getId(&rid) == ncclSuccess && init(&rcomm, 1, rid, 0) == ncclSuccess) {
      static const size_t sizes[] = {2, 1 << 20};
      for (int k = 0; k < 2; ++k) {
        const int iters = sizes[k] < 1024 ? 2000 : 200;
        double shim = timeCalls(ncclAllReduce, d, sizes[k], comm, s, iters);
        double direct = timeCalls(realAllReduce, d, sizes[k], rcomm, s, iters);
        printf("device allreduce %zu bytes: shim %.2f us, real NCCL %.2f us, ratio %.3f\n", sizes[k] * 4, shim,
               direct, shim / direct);
      }
    }
  }
  /* Two ranks on the one GPU: the real NCCL refuses them, so the shim's
   * communicators have no real one and gradcomm's device path serves their
   * collectives and point-to-point transfers. */
  {
    ncclComm_t two[2];
    int devs[2] = {0, 0};
    NCCL_OK(ncclCommInitAll(two, 2, devs));
    float* x[2];
    for (int r = 0; r < 2; ++r) {
      CUDA_OK(cudaMalloc((void**)&x[r], kCount * sizeof(float)));
      CUDA_OK(cudaMemcpy(x[r], h, kCount * sizeof(float), cudaMemcpyHostToDevice));
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r) NCCL_OK(ncclAllReduce(x[r], x[r], kCount, ncclFloat32, ncclSum, two[r], s));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s));
    for (int r = 0; r < 2; ++r) {
      CUDA_OK(cudaMemcpy(back, x[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int i = 0; i < kCount && !bad; ++i) bad = back[i] != 2.0f * h[i];
      CHECK(!bad, "two ranks sharing the GPU: rank %d's device allreduce is wrong", r);
    }
    /* point-to-point on device buffers: rank 0's buffer to rank 1 */
    CUDA_OK(cudaMemcpy(x[0], h, kCount * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(x[1], 0, kCount * sizeof(float)));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(x[0], kCount, ncclFloat32, 1, two[0], s));
    NCCL_OK(ncclRecv(x[1], kCount, ncclFloat32, 0, two[1], s));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(back, x[1], kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back, h, kCount * sizeof(float)), "two ranks sharing the GPU: device send/recv changed the data");
    for (int r = 0; r < 2; ++r) {
      cudaFree(x[r]);
      ncclCommDestroy(two[r]);
    }
    printf("two ranks sharing the GPU, served by gradcomm: %s\n", failures ? "FAILED" : "exact");
  }

  /* Two processes on the one GPU (ncclCommInitRank in each); a process that
   * stops early leaves the other waiting at most GRADCOMM_TIMEOUT. */
  int mode = cudaComputeModeDefault;
  cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0);
  if (mode != cudaComputeModeDefault) {
    printf("two processes sharing the GPU: skipped (the GPU's compute mode admits one process)\n");
  } else {
    setenv("GRADCOMM_TIMEOUT", "60s", 0);
    ncclUniqueId sid;
    NCCL_OK(ncclGetUniqueId(&sid));
    char hex[2 * sizeof sid.internal + 1];
    for (size_t i = 0; i < sizeof sid.internal; ++i) sprintf(hex + 2 * i, "%02x", (unsigned char)sid.internal[i]);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
      execl("/proc/self/exe", argv[0], "--shared-gpu-child", hex, (char*)NULL);
      _exit(127);
    }
    CHECK(child > 0, "fork failed");
    int mine = child > 0 ? sharedGpuRank(0, &sid) : 1;
    int st = 0;
    if (child > 0) {
      if (mine) kill(child, SIGKILL);  /* it may wait for this rank */
      waitpid(child, &st, 0);
    }
    CHECK(mine == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "two processes sharing the GPU: rank 0 had %d failure(s), rank 1 exited with %d", mine,
          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("two processes sharing the GPU, served by gradcomm: %s\n", failures ? "FAILED" : "exact");
  }

  NCCL_OK(ncclCommDestroy(comm));
  cudaFree(d);
  cudaFree(e);
  free(h);
  free(back);
  printf("%s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
