/* Groups through the C ABI on the simulator (NCCL_RS_BACKEND=sim): non-blocking groups
 * (ncclGroupEnd returns ncclInProgress, ncclCommGetAsyncError reports it until the group's
 * work was issued), ncclGroupSimulateEnd, the legacy ncclBcast, ncclSend/ncclRecv.
 * Simulated device memory is host memory: buffers are filled and checked directly.
 * Exits 0 and prints "capi ok" when every check passed. */
#define _POSIX_C_SOURCE 199309L /* nanosleep under -std=c11 */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
      failures++;                                                          \
    }                                                                      \
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

_Static_assert(sizeof(ncclSimInfo_t) == 24, "ncclSimInfo_t size");
_Static_assert(offsetof(ncclSimInfo_t, magic) == 8, "magic offset");
_Static_assert(offsetof(ncclSimInfo_t, estimatedTime) == 16, "estimatedTime offset");

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Polls until the communicator's state leaves ncclInProgress. */
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  for (long i = 0; i < 60000; i++) {
    CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress) return state;
    sleep_ms(1);
  }
  return state;
}

/* A scrambled value per (rank, element), below 2^24 (sums stay exact). */
static int value(int rank, int i) {
  return (int)((((unsigned)rank + 1u) * 2654435761u ^ (unsigned)i * 40503u) & 0xffffffu);
}

static void nonblocking_groups(void) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comms[NDEV];
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(2 + r));
    ncclResult_t res = ncclCommInitRankConfig(&comms[r], NDEV, id, r, &cfg);
    EXPECT(res == ncclInProgress || res == ncclSuccess, "init %d", (int)res);
  }
  for (int r = 0; r < NDEV; r++) EXPECT(settle(comms[r]) == ncclSuccess, "init of rank %d", r);

  enum { COUNT = 30000 }; /* 120 KB: more than a connection's FIFO */
  int* send[NDEV];
  int* recv[NDEV];
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(2 + r));
    CHECK(ncclMemAlloc((void**)&send[r], COUNT * sizeof(int)));
    CHECK(ncclMemAlloc((void**)&recv[r], COUNT * sizeof(int)));
    for (int i = 0; i < COUNT; i++) send[r][i] = value(r, i);
    memset(recv[r], 0xA5, COUNT * sizeof(int));
  }
  /* Rank 0 exchanges with rank 1, which has not been asked yet: issued in the background. */
  CHECK(ncclGroupStart());
  CHECK(ncclSend(send[0], COUNT, ncclInt32, 1, comms[0], NULL));
  CHECK(ncclRecv(recv[0], COUNT, ncclInt32, 1, comms[0], NULL));
  ncclResult_t res = ncclGroupEnd();
  EXPECT(res == ncclInProgress, "group end of rank 0: %d", (int)res);
  sleep_ms(100);
  ncclResult_t state = ncclSuccess;
  CHECK(ncclCommGetAsyncError(comms[0], &state));
  EXPECT(state == ncclInProgress, "rank 0 waits for rank 1: %d", (int)state);
  /* Using it before it reports ncclSuccess is refused, as NCCL refuses it. */
  int n = 0;
  EXPECT(ncclCommCount(comms[0], &n) == ncclInvalidArgument, "count while in progress");
  EXPECT(strstr(ncclGetLastError(NULL), "ncclCommGetAsyncError") != NULL, "message: %s",
         ncclGetLastError(NULL));
  EXPECT(ncclAllReduce(send[0], send[0], 1, ncclInt32, ncclSum, comms[0], NULL) ==
             ncclInvalidArgument, "collective while in progress");
  CHECK(ncclCommGetAsyncError(comms[0], &state));
  EXPECT(state == ncclInProgress, "still in progress: %d", (int)state);

  CHECK(ncclGroupStart());
  CHECK(ncclSend(send[1], COUNT, ncclInt32, 0, comms[1], NULL));
  CHECK(ncclRecv(recv[1], COUNT, ncclInt32, 0, comms[1], NULL));
  res = ncclGroupEnd();
  EXPECT(res == ncclInProgress, "group end of rank 1: %d", (int)res);
  for (int r = 0; r < NDEV; r++) EXPECT(settle(comms[r]) == ncclSuccess, "rank %d", r);
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(2 + r));
    CHECK(ncclRsStreamSynchronize(NULL));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++) wrong += recv[r][i] != value(1 - r, i);
    EXPECT(wrong == 0, "rank %d received %d wrong of %d", r, wrong, COUNT);
  }

  /* Collectives of both ranks from this one thread, in one non-blocking group. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < NDEV; r++)
    CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclInt32, ncclSum, comms[r], NULL));
  res = ncclGroupEnd();
  EXPECT(res == ncclInProgress, "collective group: %d", (int)res);
  for (int r = 0; r < NDEV; r++) EXPECT(settle(comms[r]) == ncclSuccess, "rank %d", r);
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(2 + r));
    CHECK(ncclRsStreamSynchronize(NULL));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++) wrong += recv[r][i] != value(0, i) + value(1, i);
    EXPECT(wrong == 0, "all-reduce rank %d: %d wrong of %d", r, wrong, COUNT);
  }
  CHECK(ncclCommCount(comms[0], &n));
  EXPECT(n == NDEV, "count %d", n);
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclMemFree(send[r]));
    CHECK(ncclMemFree(recv[r]));
    CHECK(ncclCommDestroy(comms[r]));
  }
}

static void bcast_and_simulate(void) {
  ncclComm_t comms[NDEV];
  int devs[NDEV] = {4, 5};
  CHECK(ncclCommInitAll(comms, NDEV, devs));
  enum { COUNT = 5000 };
  double* buf[NDEV];
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(devs[r]));
    CHECK(ncclMemAlloc((void**)&buf[r], COUNT * sizeof(double)));
    for (int i = 0; i < COUNT; i++) buf[r][i] = r == 1 ? 0.25 * value(7, i) : -1.0;
  }

  /* ncclGroupSimulateEnd: nothing runs, the time is estimated. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT(sim.estimatedTime == NCCL_UNDEF_FLOAT && sim.version == NCCL_VERSION_CODE, "init");
  CHECK(ncclGroupStart());
  for (int r = 0; r < NDEV; r++) CHECK(ncclBcast(buf[r], COUNT, ncclDouble, 1, comms[r], NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0.0f, "estimated %f", (double)sim.estimatedTime);
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(devs[r]));
    CHECK(ncclRsStreamSynchronize(NULL));
  }
  EXPECT(buf[0][0] == -1.0 && buf[0][COUNT - 1] == -1.0, "the simulated broadcast ran");
  /* Twice the work on each rank: about twice the time. */
  ncclSimInfo_t twice = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < NDEV; r++) CHECK(ncclBcast(buf[r], COUNT, ncclDouble, 1, comms[r], NULL));
  CHECK(pncclGroupSimulateEnd(&twice));
  EXPECT(twice.estimatedTime > 1.99f * sim.estimatedTime &&
             twice.estimatedTime < 2.01f * sim.estimatedTime,
         "%f vs %f", (double)twice.estimatedTime, (double)sim.estimatedTime);

  /* Bad simInfo: an invalid argument, and the group is over (its operations dropped). */
  EXPECT(ncclGroupSimulateEnd(NULL) == ncclInvalidArgument, "null outside a group");
  CHECK(ncclGroupStart());
  CHECK(ncclBcast(buf[0], COUNT, ncclDouble, 1, comms[0], NULL));
  EXPECT(ncclGroupSimulateEnd(NULL) == ncclInvalidArgument, "null");
  EXPECT(strstr(ncclGetLastError(NULL), "simInfo") != NULL, "message: %s", ncclGetLastError(NULL));
  EXPECT(ncclGroupEnd() == ncclInvalidUsage, "the group was ended");
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0x12345678;
  CHECK(ncclGroupStart());
  EXPECT(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument, "bad magic");
  EXPECT(strstr(ncclGetLastError(NULL), "magic") != NULL, "message: %s", ncclGetLastError(NULL));
  EXPECT(bad.estimatedTime == NCCL_UNDEF_FLOAT, "untouched");
  ncclSimInfo_t small = NCCL_SIM_INFO_INITIALIZER;
  small.size = 8;
  CHECK(ncclGroupStart());
  EXPECT(ncclGroupSimulateEnd(&small) == ncclInvalidArgument, "small size");
  EXPECT(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage, "no group");
  /* Nested: the inner end only closes its level. */
  ncclSimInfo_t inner = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclGroupStart());
  CHECK(ncclGroupSimulateEnd(&inner));
  EXPECT(inner.estimatedTime == NCCL_UNDEF_FLOAT, "inner level: %f", (double)inner.estimatedTime);
  CHECK(ncclGroupEnd());

  /* ncclBcast for real: in place, from rank 1. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < NDEV; r++) CHECK(ncclBcast(buf[r], COUNT, ncclDouble, 1, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclRsSetDevice(devs[r]));
    CHECK(ncclRsStreamSynchronize(NULL));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++) wrong += buf[r][i] != 0.25 * value(7, i);
    EXPECT(wrong == 0, "bcast rank %d: %d wrong of %d", r, wrong, COUNT);
  }
  EXPECT(ncclBcast(buf[0], COUNT, ncclDouble, 2, comms[0], NULL) == ncclInvalidArgument,
         "root out of range");
  EXPECT(ncclBcast(buf[0], COUNT, ncclDouble, -1, comms[0], NULL) == ncclInvalidArgument,
         "negative root");
  EXPECT(pncclBcast(NULL, COUNT, ncclDouble, 0, comms[0], NULL) == ncclInvalidArgument,
         "null buffer on the root");
  for (int r = 0; r < NDEV; r++) {
    CHECK(ncclMemFree(buf[r]));
    CHECK(ncclCommDestroy(comms[r]));
  }
}

int main(void) {
  nonblocking_groups();
  bcast_and_simulate();
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("capi ok\n");
  return 0;
}
