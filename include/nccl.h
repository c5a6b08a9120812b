/*
 * nccl.h for nccl-rs: the C interface of libnccl.so.2 as built by nccl-rs (feature "capi").
 * Written for this project after NCCL 2.25's documented API: same names, values and layouts,
 * so that programs written against NVIDIA NCCL build and run against it unchanged.
 * It needs no CUDA header: cudaStream_t is declared here as CUDA declares it.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 29
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were encoded X*1000+Y*100+Z, later ones X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA stream (CUstream); the same declaration as the CUDA runtime's. */
typedef struct CUstream_st* cudaStream_t;

/* A communicator: an opaque handle. */
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL
/* A registered window (NCCL 2.27): an opaque handle. */
typedef struct ncclWindow* ncclWindow_t;

#define NCCL_UNIQUE_ID_BYTES 128
/* Made by ncclGetUniqueId on one rank and passed to every rank out of band. */
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* What every function returns. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

/* ncclCommWindowRegister flags (NCCL 2.27) */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01

/* ncclCommRevoke flags (NCCL 2.28) */
#define NCCL_REVOKE_DEFAULT 0x00 /* the only one: must be 0 */

/* ncclCommShrink flags (NCCL 2.27) */
#define NCCL_SHRINK_DEFAULT 0x00 /* the parent stays as it is */
#define NCCL_SHRINK_ABORT 0x01   /* first stop the parent's operations in flight */

/* Communicator options. Start from NCCL_CONFIG_INITIALIZER and set the fields wanted;
 * the first three are filled by the initializer and never touched. */
typedef struct ncclConfig_v22900 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;       /* 0: creation, split and finalize return ncclInProgress and complete
                         in the background; poll ncclCommGetAsyncError */
  int cgaClusterSize; /* 0 to 8 */
  int minCTAs;        /* fewest CTAs (channels) a collective uses */
  int maxCTAs;        /* most CTAs (channels) a collective uses */
  const char* netName;
  int splitShare;     /* 0 or 1 */
  int trafficClass;
  const char* commName;
  int collnetEnable;  /* 0 or 1 */
  int CTAPolicy;      /* NCCL 2.27: NCCL_CTA_POLICY_*; ZERO: AllGather, AlltoAll, Gather and
                         Scatter on symmetric windows run on the copy engines */
  int shrinkShare;    /* NCCL 2.27: 0 or 1, recorded */
  int nvlsCTAs;       /* NCCL 2.27: CTAs of NVLS collectives, 1 to 64 */
  int nChannelsPerNetPeer; /* NCCL 2.28: 1 to 64, recorded */
  int nvlinkCentricSched;  /* NCCL 2.28: 0 or 1, recorded */
  int graphUsageMode;      /* NCCL 2.29: 0 no CUDA graphs, 1 one graph, 2 graphs mixed */
  int numRmaCtx;           /* NCCL 2.29: contexts of one-sided operations, at least 1 */
} ncclConfig_t;

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_CONFIG_INITIALIZER                                                      \
  {                                                                                  \
    sizeof(ncclConfig_t),                              /* size */                    \
        0xcafebeef,                                    /* magic */                   \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */              \
        NCCL_CONFIG_UNDEF_INT,                         /* blocking */                \
        NCCL_CONFIG_UNDEF_INT,                         /* cgaClusterSize */          \
        NCCL_CONFIG_UNDEF_INT,                         /* minCTAs */                 \
        NCCL_CONFIG_UNDEF_INT,                         /* maxCTAs */                 \
        NCCL_CONFIG_UNDEF_PTR,                         /* netName */                 \
        NCCL_CONFIG_UNDEF_INT,                         /* splitShare */              \
        NCCL_CONFIG_UNDEF_INT,                         /* trafficClass */            \
        NCCL_CONFIG_UNDEF_PTR,                         /* commName */                \
        NCCL_CONFIG_UNDEF_INT,                         /* collnetEnable */           \
        NCCL_CONFIG_UNDEF_INT,                         /* CTAPolicy */               \
        NCCL_CONFIG_UNDEF_INT,                         /* shrinkShare */             \
        NCCL_CONFIG_UNDEF_INT,                         /* nvlsCTAs */                \
        NCCL_CONFIG_UNDEF_INT,                         /* nChannelsPerNetPeer */     \
        NCCL_CONFIG_UNDEF_INT,                         /* nvlinkCentricSched */      \
        NCCL_CONFIG_UNDEF_INT,                         /* graphUsageMode */          \
        NCCL_CONFIG_UNDEF_INT                          /* numRmaCtx */               \
  }

#define NCCL_UNDEF_FLOAT -1.0f

/* What ncclGroupSimulateEnd reports. Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v1 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime; /* the model's time of the group's operations, microseconds */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                    \
  {                                                                                  \
    sizeof(ncclSimInfo_t),                             /* size */                    \
        0x74685283,                                    /* magic */                   \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */              \
        NCCL_UNDEF_FLOAT                               /* estimatedTime */           \
  }

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Reductions (built-in ones; user-defined operators are not provided yet). */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives (nccl-rs: host-immediate only for now). */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;


/* Every function below also exists as pnccl<Name> (the profiling interface). */

/* Version and errors */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);
/* The message of the last error; comm may be NULL. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Communicator creation */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);
/* Several ids (each from ncclGetUniqueId), the same on every rank; each id's root serves a
 * contiguous block of about nranks/nId ranks. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);
/* ndev communicators of one process; devlist NULL means devices 0..ndev-1. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
/* Ranks with the same color form a communicator, ordered by key then by rank in comm;
 * NCCL_SPLIT_NOCOLOR gives *newcomm = NULL. config NULL inherits comm's options. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);
/* NCCL 2.27: the ranks not in excludeRanksList form *newcomm, in their order in comm;
 * excluded ranks do not call it. config NULL inherits comm's options. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* NCCL 2.29: growing a communicator. One rank of comm (the root) gets a grow id and hands it
 * to the new ranks; then every rank calls ncclCommGrow: the ranks of comm with rank -1 (the
 * root with its id, the others with NULL), keeping their ranks; each new rank with comm NULL,
 * the id and its rank (from comm's size up to nRanks - 1). comm itself stays as it is. */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                           ncclComm_t* newcomm, ncclConfig_t* config);

/* Communicator end of life */
/* NCCL 2.28: stops this rank's operations in flight; the communicator is then good only for
 * ncclCommShrink, ncclCommSplit, ncclCommDestroy and ncclCommAbort. Not collective. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Communicator queries */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* Memory for NCCL buffers, on the current device */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* Collectives */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);
/* The legacy in-place Broadcast: buff is the root's input and every rank's output. */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
/* NCCL 2.28's all-to-all, gather and scatter: one group of sends and receives each.
 * ncclAlltoAll: block j (count elements) of sendbuff to rank j; not in place.
 * ncclGather: every rank's count elements to block i of recvbuff on root.
 * ncclScatter: block i of sendbuff on root to rank i's recvbuff. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* Point to point: inside a group, every send and receive goes out together at its end. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Groups. With non-blocking communicators, ncclGroupEnd may return ncclInProgress: the
 * operations are issued in the background; poll ncclCommGetAsyncError on each communicator
 * until ncclSuccess before using it (or its streams) again. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/* Ends the group without launching anything (its operations are dropped) and stores the
 * model's time for it in simInfo->estimatedTime. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

/* nccl-rs extensions, for programs without the CUDA runtime (on the CPU simulator, device
 * memory is host memory and these stand in for cudaSetDevice / cudaStreamSynchronize). */
ncclResult_t ncclRsSetDevice(int device);
ncclResult_t ncclRsStreamSynchronize(cudaStream_t stream);

/* Sum after multiplying each rank's input by *scalar (read at this call). */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Buffer registration: the buffer is checked (device memory of the communicator's GPU) and
 * recorded; the handle is for ncclCommDeregister. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);
/* Windows (NCCL 2.27): a collective call. With NCCL_WIN_COLL_SYMMETRIC (the same size on every
 * rank) AllReduce, AllGather and ReduceScatter on them take the symmetric path where every rank
 * maps every other. winFlags: NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                     ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
/* The buffer win was registered with on this rank (NCCL 2.29); local. */
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

/* One-sided operations on windows (NCCL 2.29), between ranks that map each other's windows
 * (one node, p2p): ncclPutSignal copies count elements of localbuff into peer's part of peerWin
 * at peerWinOffset bytes and then raises a signal there; ncclSignal raises one alone;
 * ncclWaitSignal holds the stream until, per descriptor, opCnt more signals came from peer.
 * sigIdx, ctx and flags are reserved: 0. Across nodes: ncclInvalidUsage (not implemented). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                            unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                            cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                             cudaStream_t stream);

/* NCCL 2.29: release a communicator's connection memory while it is idle, and take it back.
 * Both are collective; in between, every operation on the communicator is ncclInvalidUsage. */
#define NCCL_SUSPEND_MEM 0x01
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* NCCL 2.29: the device memory a communicator holds: what ncclCommSuspend releases, whether it
 * is released now, what persists, and the total. */
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);

/* NCCL 2.29's communicator properties (declared by NCCL's nccl_device/core.h, here for C
 * programs without it; the layout is 2.29.7's, whose fields past ginType 2.29.4 added). */
#ifndef _NCCL_DEVICE_CORE_H_
#include <stdbool.h>
typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4
} ncclGinType_t;
typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;               /* the GPU's index in NVML's order (PCI bus order) */
  bool deviceApiSupport;     /* every rank maps every other: one LSA team */
  bool multimemSupport;      /* NVLS on: symmetric windows get multicast objects */
  ncclGinType_t ginType;     /* NCCL_GIN_TYPE_PROXY where the communicator spans nodes */
  int nLsaTeams;
  bool hostRmaSupport;       /* ncclPutSignal, ncclSignal, ncclWaitSignal */
  ncclGinType_t railedGinType;
} ncclCommProperties_t;
#define NCCL_COMM_PROPERTIES_INITIALIZER                                                   \
  {                                                                                        \
    sizeof(ncclCommProperties_t), 0xcafebeef, NCCL_VERSION(2, 29, 7), 0, 0, 0, 0, false, false, \
        NCCL_GIN_TYPE_NONE, 0, false, NCCL_GIN_TYPE_NONE                                   \
  }
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
ncclResult_t pncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
#endif

/* NCCL 2.28's C++ device API is not provided: ncclDevCommCreate and ncclDevCommDestroy exist
 * (so programs that link them load) and return ncclInvalidUsage, whose message names the Rust
 * device API (nccl_device::api). Their structures belong to NCCL's device headers, so here
 * they are untyped. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void* devComm);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
