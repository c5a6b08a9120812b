/*
 * nccl_profiler.h: the profiler plugin ABI that nccl-rs loads (NCCL_PROFILER_PLUGIN),
 * versions 4 to 6.
 *
 * Written for nccl-rs from the public description of NCCL's profiler plugin interface (the
 * profiler plugin README of NVIDIA/nccl and the layouts public plugins build against), with
 * NCCL's names, so that a plugin written for NCCL builds against this header unchanged. A
 * plugin is a shared library exporting one table (a data object, not a function) named
 * ncclProfiler_vN; nccl-rs looks for v6, v5 and v4 in that order and adapts whichever it
 * finds.
 *
 * Flow: init runs once per communicator and returns a context (it also sets the activation
 * mask, a process-wide int that the plugin may rewrite at any time); startEvent is given that
 * context and a descriptor and returns an opaque event handle; recordEventState and stopEvent
 * take that handle only. A handle may still be passed as parentObj of later events after its
 * own stopEvent, so a plugin must keep it valid until finalize. Only init's return value is
 * looked at; the other callbacks should return ncclSuccess. Callbacks come from several
 * threads (user threads, the proxy thread, CUDA host callbacks, net plugin threads).
 */
#ifndef NCCL_RS_PROFILER_H_
#define NCCL_RS_PROFILER_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* pid_t */
#ifndef __cplusplus
#include <stdbool.h>
#endif

/* ncclResult_t (nccl.h), ncclDebugLogger_t and ncclProfilerCallback_t (the net plugin side of
 * the NetPlugin events). */
#include "nccl_net.h"

/* ---------------------------------------------------------------------------------------- */
/* Event types: bits of the activation mask, and the type of an event descriptor.           */

enum {
  ncclProfileGroup = (1 << 0),         /* v1: legacy group event (launch of a group) */
  ncclProfileColl = (1 << 1),          /* v1: one collective of a launch */
  ncclProfileP2p = (1 << 2),           /* v1: one send or receive of a launch */
  ncclProfileProxyOp = (1 << 3),       /* v1: proxy progress of one (channel, peer, direction) */
  ncclProfileProxyStep = (1 << 4),     /* v1: one step of a proxy op */
  ncclProfileProxyCtrl = (1 << 5),     /* v1: proxy thread activity (idle, sleep, append) */
  ncclProfileKernelCh = (1 << 6),      /* v3: one channel of a kernel (GPU timestamps) */
  ncclProfileNetPlugin = (1 << 7),     /* v3: an event defined by the net plugin */
  ncclProfileGroupApi = (1 << 8),      /* v5: outermost ncclGroupStart/End (or implicit group) */
  ncclProfileCollApi = (1 << 9),       /* v5: a collective API call */
  ncclProfileP2pApi = (1 << 10),       /* v5: a send/recv API call */
  ncclProfileKernelLaunch = (1 << 11), /* v5: a kernel launch */
  ncclProfileCeColl = (1 << 12),       /* v6: a collective run by the copy engine */
  ncclProfileCeSync = (1 << 13),       /* v6: a synchronization inside a CE collective */
  ncclProfileCeBatch = (1 << 14)       /* v6: a batch of copies inside a CE collective */
};

/* Net plugin ids (netPlugin.id): the plugin's type in the high 16 bits, its version in the
 * low 16 bits. */
#define NCCL_PROFILER_NET_VER_BITS (16)
#define NCCL_PROFILER_NET_VER_MASK (~0U >> NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_MASK (~0U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_IB (1U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_SOCK (2U << NCCL_PROFILER_NET_VER_BITS)

/* The type argument of the profiler callback a net plugin calls (ncclProfilerCallback_t). */
enum {
  ncclProfilerNetEventStart = 0,
  ncclProfilerNetEventStop = 1,
  ncclProfilerNetEventUpdate = 2,
  ncclProfilerNetEventUpdateAndStop = 3
};

/* ---------------------------------------------------------------------------------------- */
/* Event states given to recordEventState (one enum for every version).                      */

typedef enum {
  /* ProxyOp states of v1 to v3; deprecated since v4, never emitted. */
  ncclProfilerProxyOpSendPosted = 0,
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,

  /* ProxyStep states (args: proxyStep.transSize for SendWait and RecvFlushWait). */
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,

  /* ProxyCtrl states (args: proxyCtrl.appendedProxyOps for AppendEnd). */
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,

  /* v4: a proxy op starts progressing; a send step waits for the peer. */
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,

  /* NetPlugin update (args: netPlugin.data); KernelCh end (args: kernelCh.pTimer). */
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,

  /* v5: GroupApi states (args may be NULL). */
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,

  /* v6: CE states (defined; NCCL does not emit them). */
  ncclProfilerCeCollStart = 25,
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30
} ncclProfilerEventState_t;

typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;

/* ---------------------------------------------------------------------------------------- */
/* Event descriptors. Common head: type @0, parentObj @8 (a handle this plugin returned, or
 * NULL), rank @16; then a union @24 chosen by type. Byte offsets are for LP64 targets.       */

/* v4: type is one byte; 104 bytes in all. parentObj of Coll/P2p is the Group handle. */
typedef struct {
  uint8_t type;     /* @0: one ncclProfile* value */
  void* parentObj;  /* @8 */
  int rank;         /* @16: the communicator rank (0 for Group, KernelCh, ProxyCtrl) */
  union {           /* @24 */
    struct {
      uint64_t seqNumber;   /* @24: per communicator and collective kind, from 0 */
      const char* func;     /* @32: "AllReduce", ... */
      void const* sendBuff; /* @40 */
      void* recvBuff;       /* @48 */
      size_t count;         /* @56 */
      int root;             /* @64 */
      const char* datatype; /* @72: "ncclFloat32", ... */
      uint8_t nChannels;    /* @80 */
      uint8_t nWarps;       /* @81 */
      const char* algo;     /* @88: "RING", "TREE", ... */
      const char* proto;    /* @96: "LL", "LL128", "SIMPLE" */
    } coll;

    struct {
      const char* func;     /* @24: "Send" or "Recv" */
      void* buff;           /* @32 */
      const char* datatype; /* @40 */
      size_t count;         /* @48 */
      int peer;             /* @56 */
      uint8_t nChannels;    /* @60 */
    } p2p;

    struct {
      pid_t pid;            /* @24: the process that posted the op */
      uint8_t channelId;    /* @28 */
      int peer;             /* @32 */
      int nSteps;           /* @36 */
      int chunkSize;        /* @40 */
      int isSend;           /* @44 */
    } proxyOp;

    struct {
      int step;             /* @24 */
    } proxyStep;

    struct {
      uint8_t channelId;    /* @24 */
      uint64_t pTimer;      /* @32: GPU globaltimer (ns) at the channel's start */
    } kernelCh;

    struct {
      int64_t id;           /* @24: NCCL_PROFILER_NET_TYPE_* | version */
      void* data;           /* @32: the net plugin's own event data */
    } netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

/* v5: type is 8 bytes; API events added; Coll/P2p get parentGroup (the Group handle), their
 * parentObj being the CollApi/P2pApi handle. 112 bytes in all. */
typedef struct {
  uint64_t type;    /* @0 */
  void* parentObj;  /* @8 */
  int rank;         /* @16 */
  union {           /* @24 */
    struct {
      bool graphCaptured;   /* @24 */
      int groupDepth;       /* @28: 1 for an implicit group */
    } groupApi;

    struct {
      const char* func;     /* @24 */
      size_t count;         /* @32 */
      const char* datatype; /* @40 */
      int root;             /* @48 */
      void* stream;         /* @56 */
      bool graphCaptured;   /* @64 */
    } collApi;

    struct {
      const char* func;     /* @24 */
      size_t count;         /* @32 */
      const char* datatype; /* @40 */
      void* stream;         /* @48 */
      bool graphCaptured;   /* @56 */
    } p2pApi;

    struct {
      void* stream;         /* @24 */
    } kernelLaunch;

    struct {
      uint64_t seqNumber;   /* @24 */
      const char* func;     /* @32 */
      void const* sendBuff; /* @40 */
      void* recvBuff;       /* @48 */
      size_t count;         /* @56 */
      int root;             /* @64 */
      const char* datatype; /* @72 */
      uint8_t nChannels;    /* @80 */
      uint8_t nWarps;       /* @81 */
      const char* algo;     /* @88 */
      const char* proto;    /* @96 */
      void* parentGroup;    /* @104 */
    } coll;

    struct {
      const char* func;     /* @24 */
      void* buff;           /* @32 */
      const char* datatype; /* @40 */
      size_t count;         /* @48 */
      int peer;             /* @56 */
      uint8_t nChannels;    /* @60 */
      void* parentGroup;    /* @64 */
    } p2p;

    struct {
      pid_t pid;            /* @24 */
      uint8_t channelId;    /* @28 */
      int peer;             /* @32 */
      int nSteps;           /* @36 */
      int chunkSize;        /* @40 */
      int isSend;           /* @44 */
    } proxyOp;

    struct {
      int step;             /* @24 */
    } proxyStep;

    struct {
      uint8_t channelId;    /* @24 */
      uint64_t pTimer;      /* @32 */
    } kernelCh;

    struct {
      int64_t id;           /* @24 */
      void* data;           /* @32 */
    } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

/* v6: v5 plus the copy-engine events; still 112 bytes. */
typedef struct {
  uint64_t type;    /* @0 */
  void* parentObj;  /* @8 */
  int rank;         /* @16 */
  union {           /* @24 */
    struct {
      bool graphCaptured;   /* @24 */
      int groupDepth;       /* @28 */
    } groupApi;

    struct {
      const char* func;     /* @24 */
      size_t count;         /* @32 */
      const char* datatype; /* @40 */
      int root;             /* @48 */
      void* stream;         /* @56 */
      bool graphCaptured;   /* @64 */
    } collApi;

    struct {
      const char* func;     /* @24 */
      size_t count;         /* @32 */
      const char* datatype; /* @40 */
      void* stream;         /* @48 */
      bool graphCaptured;   /* @56 */
    } p2pApi;

    struct {
      void* stream;         /* @24 */
    } kernelLaunch;

    struct {
      uint64_t seqNumber;   /* @24 */
      const char* func;     /* @32 */
      void const* sendBuff; /* @40 */
      void* recvBuff;       /* @48 */
      size_t count;         /* @56 */
      int root;             /* @64 */
      const char* datatype; /* @72 */
      uint8_t nChannels;    /* @80 */
      uint8_t nWarps;       /* @81 */
      const char* algo;     /* @88 */
      const char* proto;    /* @96 */
      void* parentGroup;    /* @104 */
    } coll;

    struct {
      const char* func;     /* @24 */
      void* buff;           /* @32 */
      const char* datatype; /* @40 */
      size_t count;         /* @48 */
      int peer;             /* @56 */
      uint8_t nChannels;    /* @60 */
      void* parentGroup;    /* @64 */
    } p2p;

    struct {
      pid_t pid;            /* @24 */
      uint8_t channelId;    /* @28 */
      int peer;             /* @32 */
      int nSteps;           /* @36 */
      int chunkSize;        /* @40 */
      int isSend;           /* @44 */
    } proxyOp;

    struct {
      int step;             /* @24 */
    } proxyStep;

    struct {
      uint8_t channelId;    /* @24 */
      uint64_t pTimer;      /* @32 */
    } kernelCh;

    struct {
      int64_t id;           /* @24 */
      void* data;           /* @32 */
    } netPlugin;

    struct {
      uint64_t seqNumber;       /* @24 */
      const char* func;         /* @32 */
      void const* sendBuff;     /* @40 */
      void* recvBuff;           /* @48 */
      size_t count;             /* @56 */
      int root;                 /* @64 */
      const char* datatype;     /* @72 */
      const char* syncStrategy; /* @80: "MC" or "UC" */
      bool intraBatchSync;      /* @88 */
      uint32_t batchSize;       /* @92 */
      uint32_t numBatches;      /* @96 */
      uint32_t ceSeqNum;        /* @100 */
      void* stream;             /* @104 */
    } ceColl;

    struct {
      bool isComplete;          /* @24 */
      int nRanks;               /* @28 */
    } ceCollSync;               /* type ncclProfileCeSync */

    struct {
      int numOps;               /* @24 */
      size_t totalBytes;        /* @32 */
      bool useIntraSync;        /* @40 */
    } ceCollBatch;              /* type ncclProfileCeBatch */
  };
} ncclProfilerEventDescr_v6_t;

/* ---------------------------------------------------------------------------------------- */
/* State arguments (8 bytes, the same in every version; may be NULL for the GroupApi states). */

typedef union {
  struct {
    size_t transSize;       /* ProxyStep: bytes sent or received */
  } proxyStep;

  struct {
    int appendedProxyOps;   /* ProxyCtrl AppendEnd */
  } proxyCtrl;

  struct {
    void* data;             /* NetPluginUpdate */
  } netPlugin;

  struct {
    uint64_t pTimer;        /* KernelChStop: GPU globaltimer (ns) at the channel's end */
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v4_t;
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

/* ---------------------------------------------------------------------------------------- */
/* The tables (48 bytes each): name, init, startEvent, stopEvent, recordEventState, finalize. */

/* v4: init(context, mask, commName, commHash, nNodes, nranks, rank, logger). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

/* v5: init(context, commId, mask, commName, nNodes, nranks, rank, logger). commName may be
 * NULL. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

/* v6: the v5 signatures with the v6 descriptor. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

/* The newest version under unversioned names. */
typedef ncclProfilerEventDescr_v6_t ncclProfilerEventDescr_t;
typedef ncclProfilerEventStateArgs_v6_t ncclProfilerEventStateArgs_t;
typedef ncclProfiler_v6_t ncclProfiler_t;

/* ---------------------------------------------------------------------------------------- */
/* Layout checks (LP64). The Rust mirror asserts the same numbers.                           */

#if defined(__x86_64__) || defined(__aarch64__)
#ifdef __cplusplus
#define NCCL_RS_PROF_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define NCCL_RS_PROF_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
/* Offset of member m of the vN descriptor. */
#define NCCL_RS_PROF_OFF(v, m, off) \
  NCCL_RS_PROF_ASSERT(offsetof(ncclProfilerEventDescr_##v##_t, m) == (off), #v " " #m)
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventDescr_v4_t) == 104, "v4 descriptor size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventDescr_v5_t) == 112, "v5 descriptor size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventDescr_v6_t) == 112, "v6 descriptor size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventStateArgs_v4_t) == 8, "v4 state args size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventStateArgs_v5_t) == 8, "v5 state args size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventStateArgs_v6_t) == 8, "v6 state args size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfilerEventState_t) == 4, "state enum size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfiler_v4_t) == 48, "v4 table size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfiler_v5_t) == 48, "v5 table size");
NCCL_RS_PROF_ASSERT(sizeof(ncclProfiler_v6_t) == 48, "v6 table size");
NCCL_RS_PROF_OFF(v4, parentObj, 8);
NCCL_RS_PROF_OFF(v4, rank, 16);
NCCL_RS_PROF_OFF(v4, coll.algo, 88);
NCCL_RS_PROF_OFF(v4, p2p.nChannels, 60);
NCCL_RS_PROF_OFF(v4, proxyOp.isSend, 44);
NCCL_RS_PROF_OFF(v4, kernelCh.pTimer, 32);
NCCL_RS_PROF_OFF(v5, parentObj, 8);
NCCL_RS_PROF_OFF(v5, rank, 16);
NCCL_RS_PROF_OFF(v5, groupApi.groupDepth, 28);
NCCL_RS_PROF_OFF(v5, collApi.graphCaptured, 64);
NCCL_RS_PROF_OFF(v5, p2pApi.graphCaptured, 56);
NCCL_RS_PROF_OFF(v5, coll.algo, 88);
NCCL_RS_PROF_OFF(v5, coll.parentGroup, 104);
NCCL_RS_PROF_OFF(v5, p2p.nChannels, 60);
NCCL_RS_PROF_OFF(v5, p2p.parentGroup, 64);
NCCL_RS_PROF_OFF(v5, kernelCh.pTimer, 32);
NCCL_RS_PROF_OFF(v6, coll.algo, 88);
NCCL_RS_PROF_OFF(v6, coll.parentGroup, 104);
NCCL_RS_PROF_OFF(v6, p2p.nChannels, 60);
NCCL_RS_PROF_OFF(v6, p2p.parentGroup, 64);
NCCL_RS_PROF_OFF(v6, kernelCh.pTimer, 32);
NCCL_RS_PROF_OFF(v6, ceColl.syncStrategy, 80);
NCCL_RS_PROF_OFF(v6, ceColl.batchSize, 92);
NCCL_RS_PROF_OFF(v6, ceColl.ceSeqNum, 100);
NCCL_RS_PROF_OFF(v6, ceColl.stream, 104);
NCCL_RS_PROF_OFF(v6, ceCollSync.nRanks, 28);
NCCL_RS_PROF_OFF(v6, ceCollBatch.totalBytes, 32);
NCCL_RS_PROF_OFF(v6, ceCollBatch.useIntraSync, 40);
#undef NCCL_RS_PROF_OFF
#undef NCCL_RS_PROF_ASSERT
#endif

#endif /* NCCL_RS_PROFILER_H_ */
