/* A thread per rank, as nccl-tests' `-t N` drives NCCL: the main thread creates every rank's
 * communicator inside one group (ncclCommInitRank per rank, each on its own device), then one
 * thread per rank runs the collectives and a send/receive ring on its own communicator, the
 * threads meeting at a spinning barrier between calls. On the simulator (NCCL_RS_BACKEND=sim):
 * simulated device memory is host memory, so buffers are filled and checked directly, and
 * every output is poisoned (with a poisoned tail past the count) before each call.
 * Exits 0 and prints "capi ok" when every check passed. */
#define _POSIX_C_SOURCE 200809L /* pthreads and sched_yield under -std=c11 */
#include <nccl.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NRANKS 3
#define MAXCOUNT 40000
#define TAIL 16
#define POISON (-12345.0f)

static atomic_int failures = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
      atomic_fetch_add(&failures, 1);                                      \
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

static ncclComm_t comms[NRANKS];
static float *send_bufs[NRANKS], *recv_bufs[NRANKS];

/* nccl-tests' barrier: the threads spin (here yielding, for the simulator's threads on a
 * small machine) until every rank's thread has arrived; a thread leaves the barrier only after
 * its own call completed, so a call that waited on another rank's thread would hang here. */
static atomic_int arrived = 0;
static atomic_int generation = 0;
static void wait_all(void) {
  int gen = atomic_load(&generation);
  if (atomic_fetch_add(&arrived, 1) + 1 == NRANKS) {
    atomic_store(&arrived, 0);
    atomic_fetch_add(&generation, 1);
    return;
  }
  while (atomic_load(&generation) == gen) sched_yield();
}

/* Small integers: every sum is exact in float, whatever order a kernel adds in. */
static float value(int rank, size_t i, int round) {
  return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)round * 5) % 17) - 8);
}

static void poison(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = POISON;
}

static void expect_tail(const char *what, int rank, const float *p, size_t n) {
  for (size_t i = n; i < n + TAIL; i++)
    EXPECT(p[i] == POISON, "%s rank %d: element %zu past the output was written", what, rank, i);
}

struct job {
  int rank;
};

static void *rank_thread(void *arg) {
  int rank = ((struct job *)arg)->rank;
  CHECK(ncclRsSetDevice(rank));
  ncclComm_t comm = comms[rank];
  float *s = send_bufs[rank], *r = recv_bufs[rank];
  size_t counts[] = {1, 37, 4099, MAXCOUNT / NRANKS};
  for (int round = 0; round < 4; round++) {
    size_t count = counts[round];
    /* AllReduce, out of place. */
    for (size_t i = 0; i < count; i++) s[i] = value(rank, i, round);
    poison(r, MAXCOUNT + TAIL);
    wait_all();
    CHECK(ncclAllReduce(s, r, count, ncclFloat, ncclSum, comm, NULL));
    CHECK(ncclRsStreamSynchronize(NULL));
    for (size_t i = 0; i < count; i++) {
      float want = 0;
      for (int k = 0; k < NRANKS; k++) want += value(k, i, round);
      EXPECT(r[i] == want, "allreduce rank %d count %zu [%zu]: %g want %g", rank, count, i, r[i],
             want);
    }
    expect_tail("allreduce", rank, r, count);
    /* AllGather: rank k's block at k * count. */
    poison(r, MAXCOUNT + TAIL);
    wait_all();
    CHECK(ncclAllGather(s, r, count, ncclFloat, comm, NULL));
    CHECK(ncclRsStreamSynchronize(NULL));
    for (int k = 0; k < NRANKS; k++)
      for (size_t i = 0; i < count; i++)
        EXPECT(r[k * count + i] == value(k, i, round), "allgather rank %d block %d [%zu]: %g",
               rank, k, i, r[k * count + i]);
    expect_tail("allgather", rank, r, NRANKS * count);
    /* A ring of sends and receives, in a group of this thread's own. */
    poison(r, MAXCOUNT + TAIL);
    wait_all();
    CHECK(ncclGroupStart());
    CHECK(ncclSend(s, count, ncclFloat, (rank + 1) % NRANKS, comm, NULL));
    CHECK(ncclRecv(r, count, ncclFloat, (rank + NRANKS - 1) % NRANKS, comm, NULL));
    CHECK(ncclGroupEnd());
    CHECK(ncclRsStreamSynchronize(NULL));
    int from = (rank + NRANKS - 1) % NRANKS;
    for (size_t i = 0; i < count; i++)
      EXPECT(r[i] == value(from, i, round), "sendrecv rank %d [%zu]: %g want %g", rank, i, r[i],
             value(from, i, round));
    expect_tail("sendrecv", rank, r, count);
    wait_all();
    if (round == 1) {
      /* NCCL 2.29: every rank suspends (its connection memory given back), is refused
         operations, and resumes; the rounds after run as before. */
      uint64_t suspendable = 0, persist = 0, total = 0, suspended = 7;
      CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &suspendable));
      CHECK(ncclCommMemStats(comm, ncclStatGpuMemPersist, &persist));
      CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &total));
      EXPECT(suspendable > 0 && suspendable + persist == total,
             "rank %d: suspendable %llu + persist %llu != total %llu", rank,
             (unsigned long long)suspendable, (unsigned long long)persist,
             (unsigned long long)total);
      CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
      CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &suspended));
      EXPECT(suspended == 1, "rank %d: suspended %llu", rank, (unsigned long long)suspended);
      EXPECT(ncclAllReduce(s, r, count, ncclFloat, ncclSum, comm, NULL) == ncclInvalidUsage,
             "rank %d: an AllReduce while suspended", rank);
      EXPECT(ncclCommSuspend(comm, NCCL_SUSPEND_MEM) == ncclInvalidUsage,
             "rank %d: a second suspend", rank);
      CHECK(ncclCommResume(comm));
      CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &suspended));
      EXPECT(suspended == 0, "rank %d: suspended %llu after resume", rank,
             (unsigned long long)suspended);
      EXPECT(ncclCommResume(comm) == ncclInvalidUsage, "rank %d: a second resume", rank);
    }
  }
  return NULL;
}

int main(void) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  /* As nccl-tests: one group on the main thread makes every rank's communicator. */
  CHECK(ncclGroupStart());
  for (int i = 0; i < NRANKS; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclCommInitRank(&comms[i], NRANKS, id, i));
  }
  CHECK(ncclGroupEnd());
  for (int i = 0; i < NRANKS; i++) {
    CHECK(ncclRsSetDevice(i));
    CHECK(ncclMemAlloc((void **)&send_bufs[i], (MAXCOUNT + TAIL) * sizeof(float)));
    CHECK(ncclMemAlloc((void **)&recv_bufs[i], (MAXCOUNT + TAIL) * sizeof(float)));
  }
  pthread_t threads[NRANKS];
  struct job jobs[NRANKS];
  for (int i = 0; i < NRANKS; i++) {
    jobs[i].rank = i;
    if (pthread_create(&threads[i], NULL, rank_thread, &jobs[i]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      return 1;
    }
  }
  for (int i = 0; i < NRANKS; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < NRANKS; i++) {
    CHECK(ncclMemFree(send_bufs[i]));
    CHECK(ncclMemFree(recv_bufs[i]));
    CHECK(ncclCommDestroy(comms[i]));
  }
  if (atomic_load(&failures) != 0) {
    fprintf(stderr, "%d checks failed\n", atomic_load(&failures));
    return 1;
  }
  printf("capi ok\n");
  return 0;
}
