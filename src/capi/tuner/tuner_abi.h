/* The layout of NCCL's tuner plugin ABI, version 5 (what NCCL 2.28 loads
 * first: it looks up ncclTunerPlugin_v5, then v4, v3, v2), written from
 * NCCL's documentation of src/include/plugin/tuner/tuner_v5.h. */
#ifndef GRADCOMM_CAPI_TUNER_ABI_H_
#define GRADCOMM_CAPI_TUNER_ABI_H_
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclFunc_t: the collective a cost table is for. */
typedef enum {
  gcFuncBroadcast = 0,
  gcFuncReduce = 1,
  gcFuncAllGather = 2,
  gcFuncReduceScatter = 3,
  gcFuncAllReduce = 4,
  gcFuncSendRecv = 5,
  gcFuncSend = 6,
  gcFuncRecv = 7,
  gcNumFuncs = 8
} gcNcclFunc_t;

/* Rows and columns of the cost table. */
enum { gcAlgoTree = 0, gcAlgoRing, gcAlgoCollNetDirect, gcAlgoCollNetChain, gcAlgoNvls, gcAlgoNvlsTree, gcAlgoPat,
       gcNumAlgorithms };
enum { gcProtoLL = 0, gcProtoLL128, gcProtoSimple, gcNumProtocols };
#define GC_ALGO_PROTO_IGNORE -1.0f

typedef void (*gcDebugLogger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} gcNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} gcTunerConstants_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes, gcDebugLogger_t logFunction,
                       gcNvlDomainInfo_v5_t* nvlDomainInfo, gcTunerConstants_v5_t* constants);
  /* collCostTable: NCCL's float[numAlgo][numProto] array of predicted
   * times cast to float** (contiguous rows, not row pointers: cast it back
   * to float (*)[numProto]); the lowest wins; GC_ALGO_PROTO_IGNORE marks
   * combinations NCCL cannot run. */
  ncclResult_t (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
} gcTuner_v5_t;

#ifdef __cplusplus
}
#endif
#endif
