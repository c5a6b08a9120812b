/* The C ABI on the simulator (NCCL_RS_BACKEND=sim): a program written against NCCL's API.
 * Device memory of the simulator is host memory, so the buffers are filled and checked
 * directly. Exits 0 and prints "capi ok" when every check passed. */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

#define CHECK(call)                                                                   \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "%s:%d: %s -> %d (%s): %s\n", __FILE__, __LINE__, #call, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                        \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#define NDEV 2
#define COUNT 1000

/* The layout C sees must be the one the library reads. */
_Static_assert(sizeof(ncclConfig_t) == 88, "ncclConfig_t size");
_Static_assert(offsetof(ncclConfig_t, numRmaCtx) == 84, "numRmaCtx offset");
_Static_assert(offsetof(ncclConfig_t, CTAPolicy) == 60, "CTAPolicy offset");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "blocking offset");
_Static_assert(offsetof(ncclConfig_t, netName) == 32, "netName offset");
_Static_assert(offsetof(ncclConfig_t, commName) == 48, "commName offset");
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId size");

static void all_reduce_init_all(void) {
  ncclComm_t comms[NDEV];
  CHECK(ncclCommInitAll(comms, NDEV, NULL));
  float* bufs[NDEV];
  for (int i = 0; i < NDEV; i++) {
    int n = -1, dev = -1, rank = -1;
    CHECK(ncclCommCount(comms[i], &n));
    CHECK(ncclCommCuDevice(comms[i], &dev));
    CHECK(ncclCommUserRank(comms[i], &rank));
    EXPECT(n == NDEV && dev == i && rank == i, "count %d device %d rank %d", n, dev, rank);
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclMemAlloc((void**)&bufs[i], COUNT * sizeof(float)));
    for (int k = 0; k < COUNT; k++) bufs[i][k] = (float)(k % 97) + 0.5f * (float)i;
  }
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclAllReduce(bufs[i], bufs[i], COUNT, ncclFloat, ncclSum, comms[i], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  for (int i = 0; i < NDEV; i++) {
    int wrong = 0;
    for (int k = 0; k < COUNT; k++) {
      float want = 2.0f * (float)(k % 97) + 0.5f;
      if (bufs[i][k] != want) wrong++;
    }
    EXPECT(wrong == 0, "rank %d: %d of %d wrong (first %f)", i, wrong, COUNT, bufs[i][0]);
  }

  /* A user operator: PreMulSum by 2 (host scalar), on the data the sum just produced. */
  ncclRedOp_t twice[NDEV];
  float two = 2.0f;
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRedOpCreatePreMulSum(&twice[i], &two, ncclFloat, ncclScalarHostImmediate, comms[i]));
    EXPECT((int)twice[i] >= (int)ncclNumOps, "user op value %d", (int)twice[i]);
  }
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclAllReduce(bufs[i], bufs[i], COUNT, ncclFloat, twice[i], comms[i], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  for (int i = 0; i < NDEV; i++) {
    int wrong = 0;
    for (int k = 0; k < COUNT; k++) {
      float want = 2.0f * NDEV * (2.0f * (float)(k % 97) + 0.5f);
      if (bufs[i][k] != want) wrong++;
    }
    EXPECT(wrong == 0, "premulsum rank %d: %d of %d wrong (first %f)", i, wrong, COUNT, bufs[i][0]);
  }
  EXPECT(ncclAllReduce(bufs[0], bufs[0], COUNT, ncclInt32, twice[0], comms[0], NULL) ==
             ncclInvalidArgument, "user op on another datatype");
  for (int i = 0; i < NDEV; i++) CHECK(ncclRedOpDestroy(twice[i], comms[i]));
  EXPECT(ncclRedOpDestroy(twice[0], comms[0]) == ncclInvalidArgument, "destroyed twice");

  /* PreMulSum by a scalar in device memory (the simulator's memory is host-addressable, so
   * the test writes it directly), read by the kernel when it runs. */
  ncclRedOp_t half[NDEV];
  float *scalars[NDEV];
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclMemAlloc((void **)&scalars[i], sizeof(float)));
    *scalars[i] = 0.5f;
    CHECK(ncclRedOpCreatePreMulSum(&half[i], scalars[i], ncclFloat, ncclScalarDevice, comms[i]));
  }
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclAllReduce(bufs[i], bufs[i], COUNT, ncclFloat, half[i], comms[i], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  for (int i = 0; i < NDEV; i++) {
    int wrong = 0;
    for (int k = 0; k < COUNT; k++) {
      float want = 0.5f * NDEV * 2.0f * NDEV * (2.0f * (float)(k % 97) + 0.5f);
      if (bufs[i][k] != want) wrong++;
    }
    EXPECT(wrong == 0, "device premulsum rank %d: %d of %d wrong (first %f)", i, wrong, COUNT,
           bufs[i][0]);
    CHECK(ncclRedOpDestroy(half[i], comms[i]));
    CHECK(ncclMemFree(scalars[i]));
  }
  EXPECT(ncclRedOpCreatePreMulSum(&half[0], &two, ncclFloat, (ncclScalarResidence_t)7, comms[0]) ==
             ncclInvalidArgument, "bad scalar residence");

  /* Buffer registration: device memory of the communicator's GPU only. */
  void *reg = NULL;
  CHECK(ncclCommRegister(comms[0], bufs[0], COUNT * sizeof(float), &reg));
  EXPECT(reg != NULL, "registration handle");
  EXPECT(ncclCommRegister(comms[0], bufs[1], COUNT * sizeof(float), &reg) == ncclInvalidArgument,
         "another GPU's buffer");
  float on_host[4];
  EXPECT(ncclCommRegister(comms[0], on_host, sizeof(on_host), &reg) == ncclInvalidArgument,
         "host memory");
  EXPECT(strstr(ncclGetLastError(NULL), "not device memory") != NULL, "message: %s",
         ncclGetLastError(NULL));
  CHECK(ncclCommDeregister(comms[0], reg)); /* failed calls left the handle alone */
  void *reg2 = NULL;
  CHECK(ncclCommRegister(comms[1], bufs[1], COUNT * sizeof(float), &reg2));
  CHECK(ncclCommDeregister(comms[1], reg2));
  EXPECT(ncclCommDeregister(comms[1], reg2) == ncclInvalidArgument, "deregistered twice");

  /* Windows (NCCL 2.27): a collective call, so one thread registers every rank's in a group;
     the handles are filled at ncclGroupEnd. */
  ncclWindow_t wins[NDEV] = {NULL};
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclCommWindowRegister(comms[i], bufs[i], COUNT * sizeof(float), &wins[i],
                                 NCCL_WIN_COLL_SYMMETRIC));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) EXPECT(wins[i] != NULL, "window handle %d", i);
  /* Two windows per communicator in one group, as nccl-tests' -R 2 registers its send and
     receive buffers: each communicator's registrations meet their peers' in call order. */
  float *second[NDEV];
  ncclWindow_t wins2[NDEV][2] = {{NULL}};
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclMemAlloc((void **)&second[i], 2 * COUNT * sizeof(float)));
    for (int k = 0; k < 2; k++)
      CHECK(ncclCommWindowRegister(comms[i], second[i] + k * COUNT, (k + 1) * 64,
                                   &wins2[i][k], NCCL_WIN_COLL_SYMMETRIC));
  }
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    EXPECT(wins2[i][0] != NULL && wins2[i][1] != NULL && wins2[i][0] != wins2[i][1],
           "rank %d: two windows in one group", i);
    for (int k = 1; k >= 0; k--) CHECK(ncclCommWindowDeregister(comms[i], wins2[i][k]));
    CHECK(ncclMemFree(second[i]));
  }
  ncclWindow_t win = NULL;
  EXPECT(ncclCommWindowRegister(comms[0], bufs[0], COUNT * sizeof(float), &win, 0x40) ==
             ncclInvalidArgument, "unknown window flag");
  /* ncclWinGetUserPtr (NCCL 2.29): each window's own buffer; a handle never registered is
     refused. */
  for (int i = 0; i < NDEV; i++) {
    void *user = NULL;
    CHECK(ncclWinGetUserPtr(comms[i], wins[i], &user));
    EXPECT(user == (void *)bufs[i], "rank %d: window's user pointer %p, not %p", i, user,
           (void *)bufs[i]);
  }
  void *user = NULL;
  EXPECT(ncclWinGetUserPtr(comms[0], (ncclWindow_t)(uintptr_t)0x7777, &user) ==
             ncclInvalidArgument, "a window never registered");
  EXPECT(ncclWinGetUserPtr(comms[0], wins[0], NULL) == ncclInvalidArgument, "outUserPtr NULL");
  EXPECT(ncclWinGetUserPtr(comms[0], NULL, &user) == ncclInvalidArgument, "win NULL");
  /* ncclCommQueryProperties (NCCL 2.29): each rank's own facts; one LSA team (every rank
     maps every other), no GIN on one node. A caller of 2.29.2's layout keeps the fields 2.29.4
     added; a bad magic, an older version or NULL is refused. */
  for (int i = 0; i < NDEV; i++) {
    ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
    p.nLsaTeams = -7;
    CHECK(ncclCommQueryProperties(comms[i], &p));
    EXPECT(p.rank == i && p.nRanks == NDEV && p.cudaDev == i, "rank %d: rank %d of %d on %d", i,
           p.rank, p.nRanks, p.cudaDev);
    EXPECT(p.deviceApiSupport && p.nLsaTeams == 1 && p.hostRmaSupport &&
               p.ginType == NCCL_GIN_TYPE_NONE && p.railedGinType == NCCL_GIN_TYPE_NONE,
           "rank %d: device API %d, %d LSA teams, host RMA %d, GIN %d", i, p.deviceApiSupport,
           p.nLsaTeams, p.hostRmaSupport, (int)p.ginType);
  }
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  props.size = offsetof(ncclCommProperties_t, nLsaTeams); /* 2.29.2's layout */
  props.nLsaTeams = -7;
  CHECK(ncclCommQueryProperties(comms[1], &props));
  EXPECT(props.rank == 1 && props.nLsaTeams == -7, "2.29.2's layout: rank %d, nLsaTeams %d",
         props.rank, props.nLsaTeams);
  props.size = sizeof(props);
  props.version = NCCL_VERSION_CODE; /* as a caller taking ncclGetVersion's */
  CHECK(ncclCommQueryProperties(comms[1], &props));
  EXPECT(props.nLsaTeams == 1, "nLsaTeams %d whatever the version", props.nLsaTeams);
  props.magic = 0;
  EXPECT(ncclCommQueryProperties(comms[0], &props) == ncclInvalidUsage, "properties' magic");
  props.magic = 0xcafebeef;
  props.size = 16;
  EXPECT(ncclCommQueryProperties(comms[0], &props) == ncclInvalidArgument, "a 16-byte struct");
  EXPECT(ncclCommQueryProperties(comms[0], NULL) == ncclInvalidArgument, "props NULL");
  /* ncclCommMemStats (NCCL 2.29): every rank holds device memory (its connections and the
     symmetric state of the windows above): the connections' large blocks suspendable, the
     rest persistent, nothing suspended now. */
  for (int i = 0; i < NDEV; i++) {
    uint64_t total = 0, persist = 0, suspendable = 7, suspended = 7;
    CHECK(ncclCommMemStats(comms[i], ncclStatGpuMemTotal, &total));
    CHECK(ncclCommMemStats(comms[i], ncclStatGpuMemPersist, &persist));
    CHECK(ncclCommMemStats(comms[i], ncclStatGpuMemSuspend, &suspendable));
    CHECK(ncclCommMemStats(comms[i], ncclStatGpuMemSuspended, &suspended));
    EXPECT(total > 0 && suspendable > 0 && persist + suspendable == total && suspended == 0,
           "rank %d: total %llu, persist %llu, suspendable %llu, suspended %llu", i,
           (unsigned long long)total, (unsigned long long)persist,
           (unsigned long long)suspendable, (unsigned long long)suspended);
  }
  uint64_t stat = 0;
  EXPECT(ncclCommMemStats(comms[0], (ncclCommMemStat_t)9, &stat) == ncclInvalidArgument,
         "an unknown stat");
  EXPECT(ncclCommMemStats(comms[0], ncclStatGpuMemTotal, NULL) == ncclInvalidArgument,
         "value NULL");
  /* One-sided (NCCL 2.29): in a group, rank i puts the first half of its window into the
     second half of rank i+1's and signals it; each rank's stream then waits for that signal. */
  for (int i = 0; i < NDEV; i++)
    for (int k = 0; k < COUNT; k++) bufs[i][k] = k < COUNT / 2 ? (float)(1000 * i + k) : -1.0f;
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclPutSignal(bufs[i], COUNT / 2, ncclFloat, (i + 1) % NDEV, wins[i],
                        COUNT / 2 * sizeof(float), 0, 0, 0, comms[i], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    ncclWaitSignalDesc_t from = {1, (i + NDEV - 1) % NDEV, 0, 0};
    CHECK(ncclWaitSignal(1, &from, comms[i], NULL));
  }
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  for (int i = 0; i < NDEV; i++) {
    int wrong = 0, from = (i + NDEV - 1) % NDEV;
    for (int k = 0; k < COUNT / 2; k++)
      if (bufs[i][COUNT / 2 + k] != (float)(1000 * from + k)) wrong++;
    EXPECT(wrong == 0, "rank %d: %d of the put's %d elements wrong", i, wrong, COUNT / 2);
  }
  EXPECT(ncclSignal(1, 3, 0, 0, comms[0], NULL) == ncclInvalidArgument, "sigIdx reserved");
  EXPECT(ncclPutSignal(bufs[0], COUNT, ncclFloat, 1, wins[0], 4, 0, 0, 0, comms[0], NULL) ==
             ncclInvalidArgument, "a put past the peer's window");
  EXPECT(ncclWaitSignal(1, NULL, comms[0], NULL) == ncclInvalidArgument, "no descriptors");
  for (int i = 0; i < NDEV; i++) CHECK(ncclCommWindowDeregister(comms[i], wins[i]));
  /* The device API (NCCL 2.28) is refused, with the reason. */
  char reqs[64] = {0}, devcomm[256];
  EXPECT(ncclDevCommCreate(comms[0], reqs, devcomm) == ncclInvalidUsage, "device API");
  EXPECT(strstr(ncclGetLastError(NULL), "device API") != NULL, "message: %s",
         ncclGetLastError(NULL));

  /* NCCL 2.28's all-to-all, then gather and scatter with root 1, one thread for both ranks. */
  float *a2a_out[NDEV];
  static float snap[NDEV][COUNT]; /* the inputs (simulated device memory is host memory) */
  const int blk = COUNT / NDEV;
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclMemAlloc((void**)&a2a_out[i], COUNT * sizeof(float)));
    memcpy(snap[i], bufs[i], sizeof snap[i]);
  }
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++)
    CHECK(ncclAlltoAll(bufs[i], a2a_out[i], blk, ncclFloat, comms[i], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++) /* back again: the inverse of an all-to-all is itself */
    CHECK(ncclAlltoAll(a2a_out[i], bufs[i], blk, ncclFloat, comms[i], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++) /* rank i's first blk to block i of rank 1's a2a_out */
    CHECK(ncclGather(bufs[i], a2a_out[i], blk, ncclFloat, 1, comms[i], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int i = 0; i < NDEV; i++) /* and scattered back into each rank's second blk */
    CHECK(ncclScatter(a2a_out[1], bufs[i] + blk, blk, ncclFloat, 1, comms[i], NULL));
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NDEV; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  int a2a_wrong = 0;
  for (int k = 0; k < blk; k++) {
    a2a_wrong += a2a_out[0][k] != snap[0][k] || a2a_out[0][blk + k] != snap[1][k];
    for (int i = 0; i < NDEV; i++)
      a2a_wrong += bufs[i][k] != snap[i][k] || bufs[i][blk + k] != snap[i][k];
  }
  EXPECT(a2a_wrong == 0, "all-to-all, gather, scatter: %d values wrong", a2a_wrong);
  for (int i = 0; i < NDEV; i++) CHECK(ncclMemFree(a2a_out[i]));
  EXPECT(ncclAlltoAll(bufs[0], bufs[0], 1, ncclFloat, comms[0], NULL) == ncclInvalidArgument,
         "in-place all-to-all");
  EXPECT(ncclGather(bufs[0], bufs[0], 1, ncclFloat, 2, comms[0], NULL) == ncclInvalidArgument,
         "gather root out of range");

  /* Bad arguments come back as codes, with a message. */
  EXPECT(ncclAllReduce(bufs[0], bufs[0], COUNT, (ncclDataType_t)42, ncclSum, comms[0], NULL) ==
             ncclInvalidArgument, "bad datatype");
  EXPECT(strstr(ncclGetLastError(NULL), "datatype 42") != NULL, "message: %s",
         ncclGetLastError(NULL));
  EXPECT(ncclAllReduce(bufs[0], bufs[0], COUNT, ncclFloat, (ncclRedOp_t)99, comms[0], NULL) ==
             ncclInvalidArgument, "bad op");
  EXPECT(ncclAllReduce(NULL, bufs[0], COUNT, ncclFloat, ncclSum, comms[0], NULL) ==
             ncclInvalidArgument, "null sendbuff");
  EXPECT(ncclAllReduce(bufs[0], bufs[0], COUNT, ncclFloat, ncclSum, NULL, NULL) ==
             ncclInvalidArgument, "null comm");
  EXPECT(ncclCommCount(comms[0], NULL) == ncclInvalidArgument, "null count");

  for (int i = 0; i < NDEV; i++) {
    ncclResult_t state = ncclInternalError;
    CHECK(ncclCommGetAsyncError(comms[i], &state));
    EXPECT(state == ncclSuccess, "async error %d", (int)state);
    CHECK(ncclMemFree(bufs[i]));
  }
  /* No finalize here: a blocking finalize waits for the other rank, driven by this thread. */
  for (int i = 0; i < NDEV; i++) CHECK(ncclCommDestroy(comms[i]));
}

static void bad_arguments(void) {
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE && v == 22907, "version %d", v);
  EXPECT(pncclGetVersion(&v) == ncclSuccess, "alias");
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument, "null version");
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "%s",
         ncclGetErrorString(ncclSuccess));
  EXPECT(strlen(ncclGetErrorString((ncclResult_t)1234)) > 0, "unknown code string");
  EXPECT(ncclGetUniqueId(NULL) == ncclInvalidArgument, "null id");
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitRank(NULL, 2, id, 0) == ncclInvalidArgument, "null comm out");
  EXPECT(ncclCommInitRank(&comm, 2, id, 5) == ncclInvalidArgument, "rank out of range");
  EXPECT(comm == NULL, "no comm on failure");
  EXPECT(ncclCommInitRank(&comm, -1, id, 0) == ncclInvalidArgument, "negative nranks");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT(ncclCommInitRankConfig(&comm, 1, id, 0, &bad) == ncclInvalidArgument, "bad magic");
  ncclConfig_t bad2 = NCCL_CONFIG_INITIALIZER;
  bad2.blocking = 3;
  EXPECT(ncclCommInitRankConfig(&comm, 1, id, 0, &bad2) == ncclInvalidArgument, "bad blocking");
  ncclUniqueId garbage;
  memset(&garbage, 0x5a, sizeof garbage);
  EXPECT(ncclCommInitRank(&comm, 1, garbage, 0) == ncclInvalidArgument, "garbage id");
  EXPECT(ncclCommInitAll(NULL, 2, NULL) == ncclInvalidArgument, "null comms");
  ncclComm_t one;
  EXPECT(ncclCommInitAll(&one, 0, NULL) == ncclInvalidArgument, "zero devices");
  /* NULL is a no-op for destroy and abort, as in NCCL (PyTorch aborts NULL comms). */
  EXPECT(ncclCommDestroy(NULL) == ncclSuccess, "destroy null");
  EXPECT(ncclCommAbort(NULL) == ncclSuccess, "abort null");
  EXPECT(ncclCommFinalize(NULL) == ncclInvalidArgument, "finalize null");
  ncclResult_t st;
  EXPECT(ncclCommGetAsyncError(NULL, &st) == ncclInvalidArgument, "async null");
  EXPECT(ncclGroupEnd() == ncclInvalidUsage, "group end without start");
  EXPECT(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, NULL) == ncclInvalidArgument, "nId 0");
  EXPECT(ncclCommInitRankScalable(&comm, 2, 0, 1, NULL, NULL) == ncclInvalidArgument,
         "null ids");
}

/* A one-rank communicator, non-blocking: created in the background, polled to completion,
 * split, finalized in the background and destroyed. */
static void nonblocking_single_rank(void) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclRsSetDevice(0));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "capi-nonblocking";
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "init returned %d", (int)r);
  EXPECT(comm != NULL, "handle before completion");
  ncclResult_t state = ncclInProgress;
  do {
    CHECK(ncclCommGetAsyncError(comm, &state));
  } while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "state %d: %s", (int)state, ncclGetLastError(NULL));
  int n = 0;
  CHECK(ncclCommCount(comm, &n));
  EXPECT(n == 1, "count %d", n);

  ncclComm_t child = NULL, none = (ncclComm_t)1;
  r = ncclCommSplit(comm, 0, 0, &child, NULL);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "split returned %d", (int)r);
  do {
    CHECK(ncclCommGetAsyncError(child, &state));
  } while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "child state %d", (int)state);
  CHECK(ncclCommUserRank(child, &n));
  EXPECT(n == 0, "child rank %d", n);
  CHECK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
  EXPECT(none == NULL, "NOCOLOR gives NULL");
  /* ncclCommShrink (NCCL 2.27) excluding nobody: a non-blocking copy of a 1-rank comm. */
  ncclComm_t shrunk = NULL;
  r = ncclCommShrink(comm, NULL, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "shrink returned %d", (int)r);
  do {
    CHECK(ncclCommGetAsyncError(shrunk, &state));
  } while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "shrunk state %d", (int)state);
  CHECK(ncclCommCount(shrunk, &n));
  EXPECT(n == 1, "shrunk count %d", n);
  int self = 0;
  ncclComm_t nothing = NULL;
  EXPECT(ncclCommShrink(comm, &self, 1, &nothing, NULL, NCCL_SHRINK_DEFAULT) ==
             ncclInvalidArgument && nothing == NULL, "shrink excluding itself");
  EXPECT(ncclCommShrink(comm, NULL, 1, &nothing, NULL, NCCL_SHRINK_DEFAULT) ==
             ncclInvalidArgument, "null exclude list");
  CHECK(ncclCommDestroy(shrunk));
  /* ncclCommGetUniqueId and ncclCommGrow (NCCL 2.29): the bad calls, each refused before any
     rank waits for another. */
  ncclUniqueId gid;
  EXPECT(ncclCommGetUniqueId(comm, NULL) == ncclInvalidArgument, "grow id into NULL");
  CHECK(ncclCommGetUniqueId(comm, &gid));
  ncclComm_t grown = (ncclComm_t)1;
  EXPECT(ncclCommGrow(comm, 1, &gid, -1, &grown, NULL) == ncclInvalidArgument && grown == NULL,
         "grow to the same size");
  EXPECT(ncclCommGrow(comm, 2, &gid, 0, &grown, NULL) == ncclInvalidArgument,
         "an old rank passing a rank");
  EXPECT(ncclCommGrow(NULL, 2, NULL, 1, &grown, NULL) == ncclInvalidArgument,
         "a new rank without the id");
  EXPECT(ncclCommGrow(NULL, 2, &gid, 2, &grown, NULL) == ncclInvalidArgument,
         "a new rank past nRanks");
  EXPECT(ncclCommGrow(comm, 0, &gid, -1, &grown, NULL) == ncclInvalidArgument, "nRanks 0");
  EXPECT(ncclCommGrow(comm, 2, &gid, -1, NULL, NULL) == ncclInvalidArgument, "newcomm NULL");

  r = ncclCommFinalize(comm);
  EXPECT(r == ncclInProgress || r == ncclSuccess, "finalize returned %d", (int)r);
  do {
    CHECK(ncclCommGetAsyncError(comm, &state));
  } while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "finalize state %d", (int)state);
  EXPECT(ncclCommFinalize(comm) == ncclInvalidUsage, "second finalize");
  CHECK(ncclCommDestroy(comm));
  /* ncclCommRevoke (NCCL 2.28): not collective; afterwards only shrink, split, destroy or
     abort. */
  EXPECT(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT) == ncclSuccess, "revoke NULL");
  EXPECT(ncclCommRevoke(child, 1) == ncclInvalidArgument, "revoke flags");
  CHECK(ncclCommRevoke(child, NCCL_REVOKE_DEFAULT));
  EXPECT(ncclCommRevoke(child, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument, "second revoke");
  EXPECT(ncclCommFinalize(child) == ncclInvalidArgument, "finalize after revoke");
  CHECK(ncclCommAbort(child));
  /* The aborted handle stays valid for a racing thread: its calls fail cleanly, and a
   * destroy frees it. */
  EXPECT(ncclCommCount(child, &n) == ncclInvalidUsage, "count after abort");
  EXPECT(strstr(ncclGetLastError(NULL), "aborted") != NULL, "message: %s",
         ncclGetLastError(NULL));
  CHECK(ncclCommDestroy(child));
}

int main(void) {
  bad_arguments();
  all_reduce_init_all();
  nonblocking_single_rank();
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("capi ok\n");
  return 0;
}
