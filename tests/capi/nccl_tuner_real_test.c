#define _POSIX_C_SOURCE 200809L
/* libgradcomm-nccl-tuner.so loaded by the real libnccl.so through
 * NCCL_TUNER_PLUGIN, with a rule for every allreduce size, then
 * allreduces of several sizes on two GPUs in one process (ncclCommInitAll):
 * NCCL consults the tuner on every one (one rank would not: NCCL runs a
 * one-rank collective as a copy, without tuning). Passes when every
 * allreduce returns ncclSuccess with the exact sum.
 *
 *   nccl_tuner_real_test PLUGIN.so LIBNCCL.so
 *
 * Exits 77 (skipped) where fewer than two CUDA devices work. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

typedef ncclResult_t (*InitAllFn)(ncclComm_t*, int, const int*);
typedef ncclResult_t (*AllReduceFn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*GroupFn)(void);
typedef ncclResult_t (*DestroyFn)(ncclComm_t);
typedef const char* (*LastErrorFn)(ncclComm_t);

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s PLUGIN.so LIBNCCL.so\n", argv[0]); return 2; }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    printf("skipped: %d working CUDA devices, two are needed for NCCL to consult its tuner\n", devices);
    return 77;
  }
  setenv("NCCL_TUNER_PLUGIN", argv[1], 1);
  setenv("GRADCOMM_NCCL_ALGO", "allreduce:0-64K:ring/ll,allreduce:ring/simple", 1);
  void* nccl = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!nccl) { fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[2], dlerror()); return 1; }
  InitAllFn initAll = (InitAllFn)dlsym(nccl, "ncclCommInitAll");
  AllReduceFn allReduce = (AllReduceFn)dlsym(nccl, "ncclAllReduce");
  GroupFn groupStart = (GroupFn)dlsym(nccl, "ncclGroupStart");
  GroupFn groupEnd = (GroupFn)dlsym(nccl, "ncclGroupEnd");
  DestroyFn destroy = (DestroyFn)dlsym(nccl, "ncclCommDestroy");
  LastErrorFn lastError = (LastErrorFn)dlsym(nccl, "ncclGetLastError");
  if (!initAll || !allReduce || !groupStart || !groupEnd || !destroy || !lastError) {
    fprintf(stderr, "FAIL: %s lacks an NCCL function\n", argv[2]);
    return 1;
  }
  ncclComm_t comms[2];
  const int devs[2] = {0, 1};
  ncclResult_t r = initAll(comms, 2, devs);
  if (r != ncclSuccess) { fprintf(stderr, "FAIL: ncclCommInitAll: %d %s\n", (int)r, lastError(NULL)); return 1; }
  static const size_t counts[] = {1, 1000, 1 << 20};
  int failures = 0;
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
    const size_t n = counts[c];
    float* buf[2];
    float* host = malloc(n * sizeof(float));
    for (int d = 0; d < 2; ++d) {
      for (size_t i = 0; i < n; ++i) host[i] = (float)(d + 1 + i % 7);
      cudaSetDevice(d);
      if (cudaMalloc((void**)&buf[d], n * sizeof(float)) != cudaSuccess ||
          cudaMemcpy(buf[d], host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "FAIL: cudaMalloc/cudaMemcpy on device %d\n", d);
        return 1;
      }
    }
    groupStart();
    for (int d = 0; d < 2; ++d) {
      r = allReduce(buf[d], buf[d], n, ncclFloat32, ncclSum, comms[d], NULL);
      if (r != ncclSuccess) { fprintf(stderr, "FAIL: ncclAllReduce %zu: %d %s\n", n, (int)r, lastError(NULL)); ++failures; }
    }
    r = groupEnd();
    if (r != ncclSuccess) { fprintf(stderr, "FAIL: ncclGroupEnd %zu: %d %s\n", n, (int)r, lastError(NULL)); ++failures; }
    for (int d = 0; d < 2; ++d) {
      cudaSetDevice(d);
      cudaDeviceSynchronize();
      cudaMemcpy(host, buf[d], n * sizeof(float), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        const float want = (float)(1 + 2 + 2 * (i % 7));
        if (host[i] != want) {
          fprintf(stderr, "FAIL: %zu floats, device %d element %zu: %g, expected %g\n", n, d, i, host[i], want);
          ++failures;
          break;
        }
      }
      cudaFree(buf[d]);
    }
    free(host);
  }
  for (int d = 0; d < 2; ++d) destroy(comms[d]);
  printf("%s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
