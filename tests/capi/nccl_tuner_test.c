#define _POSIX_C_SOURCE 200809L
/* libgradcomm-nccl-tuner.so as the real NCCL uses it: dlopen, look up
 * ncclTunerPlugin_v5, init, getCollInfo on a cost table laid out as NCCL
 * lays it out (a float[algorithms][protocols] array cast to float**, -1
 * for what cannot run), finalize. Rules come from GRADCOMM_NCCL_ALGO and a
 * tuning file. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/tuner/tuner_abi.h"

static int failures = 0;
#define CHECK(cond, ...)                     \
  do {                                       \
    if (!(cond)) {                           \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");                 \
      ++failures;                            \
    }                                        \
  } while (0)

/* As in NCCL: one 2-D array, passed as (float**)costs.rows. Guard cells on both
 * sides catch writes outside it. */
static struct {
  float before[4];
  float rows[gcNumAlgorithms][gcNumProtocols];
  float after[4];
} costs;

static void resetTable(void) {
  for (int i = 0; i < 4; ++i) costs.before[i] = costs.after[i] = 99.0f;
  for (int a = 0; a < gcNumAlgorithms; ++a) {
    for (int p = 0; p < gcNumProtocols; ++p) costs.rows[a][p] = 10.0f + a * 3 + p;
  }
  /* what NCCL marks unusable on this "system": no CollNet, no NVLS */
  for (int p = 0; p < gcNumProtocols; ++p) {
    costs.rows[gcAlgoCollNetDirect][p] = costs.rows[gcAlgoCollNetChain][p] = GC_ALGO_PROTO_IGNORE;
    costs.rows[gcAlgoNvls][p] = costs.rows[gcAlgoNvlsTree][p] = GC_ALGO_PROTO_IGNORE;
  }
}

/* The (algo, proto) NCCL would pick: the lowest cost that is not ignored. */
static void choice(int* algo, int* proto) {
  float best = 1e30f;
  for (int a = 0; a < gcNumAlgorithms; ++a)
    for (int p = 0; p < gcNumProtocols; ++p)
      if (costs.rows[a][p] != GC_ALGO_PROTO_IGNORE && costs.rows[a][p] < best) { best = costs.rows[a][p]; *algo = a; *proto = p; }
}

static void expect(const gcTuner_v5_t* t, void* ctx, int coll, size_t bytes, int algo, int proto, const char* what) {
  resetTable();
  int channels = -1, a = -1, p = -1;
  ncclResult_t r = t->getCollInfo(ctx, coll, bytes, 1, (float**)costs.rows, gcNumAlgorithms, gcNumProtocols, 0, &channels);
  CHECK(r == ncclSuccess, "%s: getCollInfo returned %d", what, (int)r);
  choice(&a, &p);
  CHECK(a == algo && p == proto, "%s: chose algo %d proto %d, expected %d/%d", what, a, p, algo, proto);
  CHECK(costs.rows[gcAlgoNvls][0] == GC_ALGO_PROTO_IGNORE, "%s: an ignored entry was changed", what);
  for (int i = 0; i < 4; ++i)
    CHECK(costs.before[i] == 99.0f && costs.after[i] == 99.0f, "%s: wrote outside the cost table", what);
  /* exactly the chosen entries changed (to 0), every other one is NCCL's */
  for (int a2 = 0; a2 < gcNumAlgorithms; ++a2)
    for (int p2 = 0; p2 < gcNumProtocols; ++p2) {
      const int ignored = a2 >= gcAlgoCollNetDirect && a2 <= gcAlgoNvlsTree;
      const float nccl = ignored ? GC_ALGO_PROTO_IGNORE : 10.0f + a2 * 3 + p2;
      CHECK(costs.rows[a2][p2] == nccl || (costs.rows[a2][p2] == 0.0f && a2 == algo),
            "%s: entry %d/%d is %g, NCCL's was %g", what, a2, p2, costs.rows[a2][p2], nccl);
    }
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s PLUGIN.so TUNING_FILE_DIR\n", argv[0]); return 2; }
  char file[4096];
  snprintf(file, sizeof file, "%s/gradcomm_tuner_test.rules", argv[2]);
  FILE* f = fopen(file, "w");
  if (!f) { perror(file); return 2; }
  fprintf(f, "# tuning file: one rule per line\nreducescatter:ring/simple\nallgather:0-1K:ring/ll\n");
  fclose(f);
  setenv("GRADCOMM_NCCL_ALGO", "allreduce:0-64K:tree/ll, allreduce:64K-1G:ring, broadcast:nvls/simple, broadcast:pat", 1);
  setenv("GRADCOMM_NCCL_TUNER_FILE", file, 1);

  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "FAIL: dlopen: %s\n", dlerror()); return 1; }
  const gcTuner_v5_t* t = (const gcTuner_v5_t*)dlsym(h, "ncclTunerPlugin_v5");
  if (!t) { fprintf(stderr, "FAIL: no ncclTunerPlugin_v5\n"); return 1; }
  CHECK(dlsym(h, "ncclTunerPlugin_v4") == NULL, "exports an older version too");
  CHECK(t->name && !strcmp(t->name, "gradcomm"), "plugin name '%s'", t->name ? t->name : "(null)");
  void* ctx = NULL;
  gcTunerConstants_v5_t constants;
  memset(&constants, 0, sizeof constants);
  gcNvlDomainInfo_v5_t nvl = {1, 8, 8};
  CHECK(t->init(&ctx, 42, 16, 2, NULL, &nvl, &constants) == ncclSuccess && ctx, "init failed");
  if (!ctx) return 1;

  expect(t, ctx, gcFuncAllReduce, 8, gcAlgoTree, gcProtoLL, "allreduce 8 B -> tree/ll");
  expect(t, ctx, gcFuncAllReduce, 65535, gcAlgoTree, gcProtoLL, "allreduce 64K-1 -> tree/ll");
  /* ring with every protocol at 0: the first of them, LL */
  expect(t, ctx, gcFuncAllReduce, 65536, gcAlgoRing, gcProtoLL, "allreduce 64K -> ring");
  /* beyond every rule: NCCL's own table (tree/LL is cheapest in it) */
  expect(t, ctx, gcFuncAllReduce, (size_t)2 << 30, gcAlgoTree, gcProtoLL, "allreduce 2G -> untouched");
  /* nvls cannot run here: the next rule (pat) applies */
  expect(t, ctx, gcFuncBroadcast, 100, gcAlgoPat, gcProtoLL, "broadcast -> pat (nvls ignored)");
  expect(t, ctx, gcFuncReduceScatter, 1 << 20, gcAlgoRing, gcProtoSimple, "file: reducescatter -> ring/simple");
  expect(t, ctx, gcFuncAllGather, 512, gcAlgoRing, gcProtoLL, "file: allgather 512 B -> ring/ll");
  CHECK(t->finalize(ctx) == ncclSuccess, "finalize failed");

  /* a malformed rule: init refuses (NCCL then runs without the plugin) */
  setenv("GRADCOMM_NCCL_ALGO", "allreduce:0-64X:tree", 1);
  ctx = NULL;
  CHECK(t->init(&ctx, 43, 16, 2, NULL, &nvl, &constants) == ncclInvalidArgument, "a bad size was accepted");
  setenv("GRADCOMM_NCCL_ALGO", "allreduce:warp", 1);
  CHECK(t->init(&ctx, 44, 16, 2, NULL, &nvl, &constants) == ncclInvalidArgument, "a bad algorithm was accepted");
  remove(file);
  printf("%s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
