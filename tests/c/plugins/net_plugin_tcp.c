/*
 * A network plugin for nccl-rs's tests, written against include/nccl_net.h: TCP over
 * 127.0.0.1 only, host memory only, one socket per connection, every message framed by an
 * 8-byte length. Requests of a comm progress in the order they were posted, inside test().
 *
 * Build flavours (cc -shared -fPIC -I include -D...):
 *   NET_VERSION=8|9|10|11  the table exported (ncclNetPlugin_vN), default 11
 *   PLUGIN_NAME="..."      the network's name (default "TestTCP")
 *   FAIL_INIT              init fails (ncclSystemError)
 *   NO_SYMBOL              the table is exported under a name nccl-rs does not look for
 *   WITH_COLLNET           also export an ncclCollNetPlugin_v8 table (reported, never used)
 *   MAX_RECVS=n            the maxRecvs property, default 1. Above 1 the plugin matches tags
 *                          and groups receives: an irecv of n buffers sends the sender one
 *                          clear-to-send entry (tag, room) per buffer; an isend waits (returns
 *                          no request) until an unused entry of its tag came, and frames its
 *                          message with the tag; the receiver puts each message into the
 *                          oldest posted buffer of its tag, and a request completes once all of
 *                          its buffers are full. So connections that share one comm never
 *                          block each other on the stream.
 *   CUDA_PTR               claim NCCL_PTR_CUDA too: regMr takes GPU memory; iflush of a GPU
 *                          region returns a request that test() completes. Where the CUDA
 *                          driver loads (dlopen libcuda.so.1) and says a region registered as
 *                          CUDA is device memory, its bytes move through the driver: a send
 *                          copies the message to a host staging buffer first, a receive lands
 *                          in one and is copied to the GPU before the request completes (both
 *                          on a non-blocking stream of the comm's own, waited for; the calling
 *                          thread must have a context of the region's device current, as
 *                          NCCL's proxy thread has: a call without one fails). Without the
 *                          driver (nccl-rs's simulator, whose GPU memory is host memory), or
 *                          for a region the driver does not know, the bytes are copied as is.
 *   DMABUF                 (with CUDA_PTR) claim NCCL_PTR_DMABUF too: regMrDmaBuf takes a
 *                          region of GPU memory with its dmabuf descriptor (checked with
 *                          fstat; the bytes are moved by address as above)
 *   HELPER_THREAD          (with MAX_RECVS 1) a thread per comm moves its bytes, so that comms
 *                          move theirs in parallel (as the socket network's helper threads);
 *                          isend, irecv and test only post and look
 *   FORCE_FLUSH            the forceFlush property (v9 on)
 *   SPEED=n                the speed property, Mb/s (default 12345)
 *
 * Counters: with TEST_PLUGIN_STATS=<path> in the environment, every close of a comm writes the
 * process's registrations by type (reg_gpu: those the CUDA driver confirmed as device memory),
 * receives posted into GPU and host regions (per buffer), flushes (of GPU and of host regions),
 * irecv calls of more than one buffer and the largest n seen, comms opened, copies through the
 * driver (device to host, host to device, bytes) and calls refused for want of a current
 * context, to <path>.<pid>, for the tests to read.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef CUDA_PTR
#include <dlfcn.h>
#endif

#include "nccl_net.h"

#ifndef NET_VERSION
#define NET_VERSION 11
#endif
#ifndef PLUGIN_NAME
#define PLUGIN_NAME "TestTCP"
#endif
#ifndef MAX_RECVS
#define MAX_RECVS 1
#endif
#ifndef SPEED
#define SPEED 12345
#endif

/* Memory handles: which kind of region was registered. MH_CUDA: GPU memory copied as host
 * memory (the simulator's); real device memory has a struct gpu_mr of its own. */
#define MH_HOST ((void*)(uintptr_t)0x1234)
#define MH_CUDA ((void*)(uintptr_t)0x1235)

static struct {
  unsigned long reg_host, reg_cuda, reg_dmabuf, reg_gpu, recv_host, recv_cuda, flush_cuda,
      flush_host;
  unsigned long recv_multi, recv_max_n, comms, copy_dtoh, copy_htod, copy_bytes, no_ctx;
} stats;

#define MAGIC 0x6e636e74u /* "tncn" */
#define NREQS NCCL_NET_MAX_REQUESTS

static ncclDebugLogger_t logf_ = NULL;

#define LOG(level, ...) \
  do { if (logf_) logf_(level, 16 /* NET */, __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* ---- GPU memory through the CUDA driver (CUDA_PTR) ---- */

/* The handle of a region the driver confirmed as device memory of device `ordinal`. */
#define GPU_MR_MAGIC 0x67707530u /* "gpu0" */
struct gpu_mr {
  uint32_t magic;
  int ordinal;
};

static const struct gpu_mr* as_gpu_mr(void* mhandle) {
  const struct gpu_mr* g = mhandle;
  if (!g || mhandle == MH_HOST || mhandle == MH_CUDA || g->magic != GPU_MR_MAGIC) return NULL;
  return g;
}

static int valid_mh(void* mhandle) {
  return mhandle == MH_HOST || mhandle == MH_CUDA || as_gpu_mr(mhandle) != NULL;
}

#ifdef CUDA_PTR
/* The driver calls this plugin makes, declared here from the driver API's documentation (no
 * CUDA header is needed to build it): results, device pointers and handles. */
typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef void* cu_context;
typedef void* cu_stream;
#define CU_OK 0
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2
#define CU_STREAM_NON_BLOCKING 1

static struct {
  int loaded; /* the driver loaded and initialised */
  cu_result (*init)(unsigned int);
  cu_result (*ctx_get_current)(cu_context*);
  cu_result (*ctx_get_device)(int*);
  cu_result (*pointer_get_attribute)(void*, int, cu_deviceptr);
  cu_result (*stream_create)(cu_stream*, unsigned int);
  cu_result (*stream_destroy)(cu_stream);
  cu_result (*stream_synchronize)(cu_stream);
  cu_result (*memcpy_dtoh_async)(void*, cu_deviceptr, size_t, cu_stream);
  cu_result (*memcpy_htod_async)(cu_deviceptr, const void*, size_t, cu_stream);
  cu_result (*get_error_string)(cu_result, const char**);
} cu;

static const char* cu_err(cu_result rc) {
  const char* s = NULL;
  if (cu.get_error_string) cu.get_error_string(rc, &s);
  return s ? s : "unknown CUDA error";
}

/* Loads the driver once (init may be called once per communicator). */
static void cuda_load(void) {
  static int tried = 0;
  void* h;
  cu_result rc;
  if (tried) return;
  tried = 1;
  h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    LOG(NCCL_LOG_INFO, PLUGIN_NAME ": no CUDA driver (%s): GPU memory is copied as host memory",
        dlerror());
    return;
  }
#define CU_LOAD(field, name)                                                     \
  do {                                                                           \
    *(void**)(&cu.field) = dlsym(h, name);                                       \
    if (!cu.field) {                                                             \
      LOG(NCCL_LOG_WARN, PLUGIN_NAME ": libcuda.so.1 lacks %s: GPU memory is copied as host memory", \
          name);                                                                 \
      return;                                                                    \
    }                                                                            \
  } while (0)
  CU_LOAD(init, "cuInit");
  CU_LOAD(ctx_get_current, "cuCtxGetCurrent");
  CU_LOAD(ctx_get_device, "cuCtxGetDevice");
  CU_LOAD(pointer_get_attribute, "cuPointerGetAttribute");
  CU_LOAD(stream_create, "cuStreamCreate");
  CU_LOAD(stream_destroy, "cuStreamDestroy_v2");
  CU_LOAD(stream_synchronize, "cuStreamSynchronize");
  CU_LOAD(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  CU_LOAD(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  CU_LOAD(get_error_string, "cuGetErrorString");
#undef CU_LOAD
  rc = cu.init(0);
  if (rc != CU_OK) {
    LOG(NCCL_LOG_WARN, PLUGIN_NAME ": cuInit: %s: GPU memory is copied as host memory",
        cu_err(rc));
    return;
  }
  cu.loaded = 1;
  LOG(NCCL_LOG_INFO, PLUGIN_NAME ": CUDA driver loaded: GPU memory moves through cuMemcpy");
}
#endif

/* The handle of a region registered as GPU memory: a gpu_mr where the driver knows `data` as
 * device memory; MH_CUDA where there is no driver or it does not know `data` (the simulator's
 * GPU memory, which is host memory); NULL, with a warning, where the driver says `data` is
 * some other kind of memory. */
__attribute__((unused)) static void* gpu_region(void* data) {
#ifdef CUDA_PTR
  unsigned int type = 0;
  int ordinal = -1;
  struct gpu_mr* g;
  cu_result rc;
  cu_deviceptr p = (cu_deviceptr)(uintptr_t)data;
  if (!cu.loaded) return MH_CUDA;
  rc = cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (rc != CU_OK) return MH_CUDA;
  if (type != CU_MEMORYTYPE_DEVICE) {
    LOG(NCCL_LOG_WARN, PLUGIN_NAME ": %p registered as CUDA memory is of memory type %u",
        data, type);
    return NULL;
  }
  rc = cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  if (rc != CU_OK) {
    LOG(NCCL_LOG_WARN, PLUGIN_NAME ": the device of %p: %s", data, cu_err(rc));
    return NULL;
  }
  g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->magic = GPU_MR_MAGIC;
  g->ordinal = ordinal;
  stats.reg_gpu++;
  return g;
#else
  (void)data;
  return MH_CUDA;
#endif
}

/* Copies n bytes between device memory `gpu` (of region `g`) and host memory `host` on the
 * comm's own non-blocking stream (never ordered behind the kernels that wait for these bytes),
 * and waits for the copy. The calling thread must have a context of the region's device
 * current. */
static ncclResult_t gpu_copy(void** stream, const struct gpu_mr* g, int to_gpu, void* gpu,
                             void* host, size_t n) {
#ifdef CUDA_PTR
  cu_context ctx = NULL;
  int dev = -1;
  cu_result rc;
  cu_deviceptr d = (cu_deviceptr)(uintptr_t)gpu;
  if (n == 0) return ncclSuccess;
  if (cu.ctx_get_current(&ctx) != CU_OK || !ctx) {
    stats.no_ctx++;
    LOG(NCCL_LOG_WARN,
        PLUGIN_NAME ": no CUDA context is current on the calling thread: cannot copy GPU memory of device %d",
        g->ordinal);
    return ncclInternalError;
  }
  if (cu.ctx_get_device(&dev) != CU_OK || dev != g->ordinal) {
    stats.no_ctx++;
    LOG(NCCL_LOG_WARN,
        PLUGIN_NAME ": the current CUDA context is device %d's, the region device %d's", dev,
        g->ordinal);
    return ncclInternalError;
  }
  if (!*stream) {
    rc = cu.stream_create(stream, CU_STREAM_NON_BLOCKING);
    if (rc != CU_OK) {
      *stream = NULL;
      LOG(NCCL_LOG_WARN, PLUGIN_NAME ": cuStreamCreate: %s", cu_err(rc));
      return ncclUnhandledCudaError;
    }
  }
  rc = to_gpu ? cu.memcpy_htod_async(d, host, n, *stream)
              : cu.memcpy_dtoh_async(host, d, n, *stream);
  if (rc == CU_OK) rc = cu.stream_synchronize(*stream);
  if (rc != CU_OK) {
    LOG(NCCL_LOG_WARN, PLUGIN_NAME ": copying %lu bytes %s GPU memory: %s", (unsigned long)n,
        to_gpu ? "to" : "from", cu_err(rc));
    return ncclUnhandledCudaError;
  }
  if (to_gpu) stats.copy_htod++; else stats.copy_dtoh++;
  stats.copy_bytes += n;
  return ncclSuccess;
#else
  (void)stream; (void)g; (void)to_gpu; (void)gpu; (void)host; (void)n;
  return ncclInternalError; /* no gpu_mr exists without CUDA_PTR */
#endif
}

struct handle {
  uint32_t magic;
  struct sockaddr_in addr;
};

struct listen_comm {
  int fd;
};

/* A tagged message's frame (MAX_RECVS > 1), and a clear-to-send entry (receiver to sender). */
struct frame {
  int32_t tag;
  uint32_t pad;
  uint64_t len;
};

struct req {
  int used;      /* handed out and not yet reported done */
  int complete;
  int is_flush;  /* a flush: its own allocation, complete at the first test */
  int is_send;
  char* data;
  size_t cap;    /* bytes to send, or room to receive */
  uint64_t hdr;  /* the message's length on the wire */
  size_t hdr_done, data_done;
  struct comm* comm;
  /* Tagged receives: n buffers, each matched to one message. */
  unsigned long seq; /* posting order */
  int n, nfull, tag;
  char* bufs[MAX_RECVS];
  size_t caps[MAX_RECVS], lens[MAX_RECVS];
  int tags[MAX_RECVS], matched[MAX_RECVS];
  /* Receives into device memory land in host staging first: where each buffer's bytes go
   * (NULL: they landed where they belong) and its region. */
  void* dst[MAX_RECVS];
  const struct gpu_mr* dmr[MAX_RECVS];
  int copied; /* (untagged) its staging went into the GPU */
};

#define NCTS (NREQS * MAX_RECVS)

struct comm {
  int fd;
  int is_send;
  struct req reqs[NREQS];
  unsigned long posted, finished; /* requests posted, and completed in order */
  /* Tagged mode. Sender: clear-to-send entries received and not yet used, oldest first (and
   * the bytes of one being read). Receiver: entries still to write, the frame being read and
   * the buffer it fills (NULL while reading a frame). */
  struct frame cts[NCTS];
  int ncts;
  struct frame cts_in;
  size_t cts_in_done;
  char cts_out[NCTS * sizeof(struct frame)];
  size_t cts_out_len;
  struct frame rframe;
  size_t rframe_done;
  struct req* rreq;
  int rbuf;
  size_t rdone;
  /* Copies of device memory: the comm's stream, and host staging per request slot and buffer
   * (kept for reuse). */
  void* stream;
  struct {
    char* p;
    size_t cap;
  } stage[NREQS][MAX_RECVS];
#ifdef HELPER_THREAD
  /* The comm's helper thread (HELPER_THREAD): the lock over posting and completing, its
   * wake-up, whether it runs, and its sticky error. */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int helped, stop;
  ncclResult_t err;
#endif
};

static ncclResult_t start_helper(struct comm* c);

/* Request r's staging buffer i, at least n bytes; NULL when out of memory. */
static char* stage_for(struct comm* c, struct req* r, int i, size_t n) {
  size_t slot = (size_t)(r - c->reqs);
  if (n == 0) n = 1;
  if (c->stage[slot][i].cap < n) {
    char* p = realloc(c->stage[slot][i].p, n);
    if (!p) return NULL;
    c->stage[slot][i].p = p;
    c->stage[slot][i].cap = n;
  }
  return c->stage[slot][i].p;
}

static int set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void tune_socket(int fd) {
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static ncclResult_t pl_devices(int* n) {
  *n = 1;
  return ncclSuccess;
}

static ncclResult_t do_listen(int dev, void* opaque, void** listen_comm) {
  struct handle* h = (struct handle*)opaque;
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  struct listen_comm* lc;
  int fd;
  if (dev != 0) return ncclInvalidArgument;
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ncclSystemError;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); /* loopback only */
  a.sin_port = 0;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) || listen(fd, 16) ||
      getsockname(fd, (struct sockaddr*)&a, &len) || set_nonblocking(fd)) {
    close(fd);
    return ncclSystemError;
  }
  memset(h, 0, NCCL_NET_HANDLE_MAXSIZE);
  h->magic = MAGIC;
  h->addr = a;
  lc = calloc(1, sizeof *lc);
  if (!lc) { close(fd); return ncclSystemError; }
  lc->fd = fd;
  *listen_comm = lc;
  return ncclSuccess;
}

static ncclResult_t do_connect(int dev, void* opaque, void** send_comm) {
  struct handle* h = (struct handle*)opaque;
  struct comm* c;
  int fd;
  *send_comm = NULL;
  if (dev != 0 || h->magic != MAGIC) return ncclInvalidArgument;
  if (h->addr.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) return ncclInvalidArgument;
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ncclSystemError;
  /* The listener is already listening: a loopback connect completes at once. */
  if (connect(fd, (struct sockaddr*)&h->addr, sizeof h->addr)) {
    LOG(NCCL_LOG_WARN, PLUGIN_NAME ": connect to port %d: %s", ntohs(h->addr.sin_port),
        strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  tune_socket(fd);
  if (set_nonblocking(fd)) { close(fd); return ncclSystemError; }
  c = calloc(1, sizeof *c);
  if (!c) { close(fd); return ncclSystemError; }
  c->fd = fd;
  c->is_send = 1;
  if (start_helper(c) != ncclSuccess) {
    close(fd);
    free(c);
    return ncclSystemError;
  }
  stats.comms++;
  *send_comm = c;
  return ncclSuccess;
}

static ncclResult_t pl_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev) {
  struct listen_comm* lc = listen_comm;
  struct comm* c;
  int fd = accept(lc->fd, NULL, NULL);
  *recv_comm = NULL;
  if (dev) *dev = NULL;
  if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? ncclSuccess
                                                                                  : ncclSystemError;
  tune_socket(fd);
  if (set_nonblocking(fd)) { close(fd); return ncclSystemError; }
  c = calloc(1, sizeof *c);
  if (!c) { close(fd); return ncclSystemError; }
  c->fd = fd;
  if (start_helper(c) != ncclSuccess) {
    close(fd);
    free(c);
    return ncclSystemError;
  }
  stats.comms++;
  *recv_comm = c;
  return ncclSuccess;
}

static void write_stats(void) {
  const char* path = getenv("TEST_PLUGIN_STATS");
  char name[4096];
  FILE* f;
  if (!path) return;
  snprintf(name, sizeof name, "%s.%d", path, (int)getpid());
  f = fopen(name, "w");
  if (!f) return;
  fprintf(f, "reg_host=%lu reg_cuda=%lu reg_dmabuf=%lu reg_gpu=%lu recv_host=%lu recv_cuda=%lu flush_cuda=%lu flush_host=%lu recv_multi=%lu recv_max_n=%lu comms=%lu copy_dtoh=%lu copy_htod=%lu copy_bytes=%lu no_ctx=%lu\n",
          stats.reg_host, stats.reg_cuda, stats.reg_dmabuf, stats.reg_gpu, stats.recv_host,
          stats.recv_cuda, stats.flush_cuda, stats.flush_host, stats.recv_multi, stats.recv_max_n,
          stats.comms, stats.copy_dtoh, stats.copy_htod, stats.copy_bytes, stats.no_ctx);
  fclose(f);
}

static ncclResult_t pl_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm; (void)size;
  *mhandle = NULL;
  if (!data) return ncclInternalError;
  if (type == NCCL_PTR_HOST) {
    stats.reg_host++;
    *mhandle = MH_HOST;
    return ncclSuccess;
  }
#ifdef CUDA_PTR
  if (type == NCCL_PTR_CUDA) {
    stats.reg_cuda++;
    *mhandle = gpu_region(data);
    return *mhandle ? ncclSuccess : ncclInternalError;
  }
#endif
  return ncclInternalError; /* a kind of memory this flavour does not take */
}

static ncclResult_t pl_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                     uint64_t offset, int fd, void** mhandle) {
  (void)comm; (void)size; (void)offset;
  stats.reg_dmabuf++;
  *mhandle = NULL;
#if defined(CUDA_PTR) && defined(DMABUF)
  {
    /* The bytes move by address (through the driver); the descriptor must be a live one. */
    struct stat st;
    if (!data || type != NCCL_PTR_CUDA || fd < 0 || fstat(fd, &st) != 0) {
      LOG(NCCL_LOG_WARN, PLUGIN_NAME ": regMrDmaBuf of %p, type %d, fd %d refused", data, type,
          fd);
      return ncclInternalError;
    }
    *mhandle = gpu_region(data);
    return *mhandle ? ncclSuccess : ncclInternalError;
  }
#else
  (void)data; (void)type; (void)fd;
  return ncclInternalError; /* no dmabuf support claimed */
#endif
}

static ncclResult_t pl_dereg_mr(void* comm, void* mhandle) {
  struct gpu_mr* g = (struct gpu_mr*)as_gpu_mr(mhandle);
  (void)comm;
  if (g) {
    g->magic = 0;
    free(g);
    return ncclSuccess;
  }
  return (mhandle == MH_HOST || mhandle == MH_CUDA) ? ncclSuccess : ncclInternalError;
}

/* A free slot for the next request, in posting order; NULL when all are in use. A tagged
 * receiver's requests complete out of order: it takes any free slot. */
static struct req* next_slot(struct comm* c) {
  struct req* r = &c->reqs[c->posted % NREQS];
#if MAX_RECVS > 1
  if (!c->is_send) {
    int i;
    for (i = 0; i < NREQS && c->reqs[i].used; i++) {}
    if (i == NREQS) return NULL;
    r = &c->reqs[i];
  }
#endif
  if (r->used) return NULL;
  memset(r, 0, sizeof *r);
  r->used = 1;
  r->comm = c;
  c->posted++;
  return r;
}

/* Moves the bytes of request r (the oldest unfinished one): 1 once they all moved, 0 while
 * the socket would block (or the peer left between messages: a departure, not an error,
 * receives stay pending), else minus the error, fatal to the comm. */
static int move_one(struct comm* c, struct req* r) {
  while (r->hdr_done < sizeof r->hdr) {
    ssize_t n = r->is_send
        ? send(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, MSG_NOSIGNAL)
        : recv(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n == 0 && r->hdr_done == 0) return 0;
    if (n <= 0) return -(int)ncclRemoteError;
    r->hdr_done += n;
    if (r->hdr_done == sizeof r->hdr && !r->is_send && r->hdr > r->cap) {
      LOG(NCCL_LOG_WARN, PLUGIN_NAME ": a %lu-byte message for a %lu-byte buffer",
          (unsigned long)r->hdr, (unsigned long)r->cap);
      return -(int)ncclInternalError;
    }
  }
  while (r->data_done < r->hdr) {
    ssize_t n = r->is_send
        ? send(c->fd, r->data + r->data_done, r->hdr - r->data_done, MSG_NOSIGNAL)
        : recv(c->fd, r->data + r->data_done, r->hdr - r->data_done, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) return -(int)ncclRemoteError;
    r->data_done += n;
  }
  return 1;
}

/* A receive that landed in staging goes into the GPU before it says it is done. */
static ncclResult_t land_in_gpu(struct comm* c, struct req* r) {
#if MAX_RECVS > 1
  (void)c; (void)r;
  return ncclSuccess; /* tagged receives copy each buffer as it fills */
#else
  if (r->is_send || !r->dmr[0] || r->copied) return ncclSuccess;
  r->copied = 1;
  return gpu_copy(&c->stream, r->dmr[0], 1, r->dst[0], r->data, r->hdr);
#endif
}

/* Moves bytes of the oldest unfinished requests; an error is fatal to the comm. */
__attribute__((unused)) static ncclResult_t progress(struct comm* c) {
  while (c->finished < c->posted) {
    struct req* r = &c->reqs[c->finished % NREQS];
    ncclResult_t rc;
    int k = move_one(c, r);
    if (k <= 0) return k < 0 ? (ncclResult_t)-k : ncclSuccess;
    rc = land_in_gpu(c, r);
    if (rc != ncclSuccess) return rc;
    r->complete = 1;
    c->finished++;
  }
  return ncclSuccess;
}

#ifdef HELPER_THREAD
#if MAX_RECVS > 1
#error "HELPER_THREAD is for MAX_RECVS 1"
#endif
/* A thread per comm moves its bytes, so that comms move theirs in parallel, as NCCL's socket
 * network's helper threads do. Requests are posted and completed under the comm's lock; a
 * posted request's buffer, size and capacity do not change, so the thread moves its bytes
 * with the lock released. It never calls CUDA: a receive into device memory is copied into
 * the GPU by test(), on the caller's thread (which has the context current). */
static void* helper(void* arg) {
  struct comm* c = arg;
  int was_ready = 0; /* the last poll said the socket was ready */
  for (;;) {
    struct req* r;
    size_t before;
    int k;
    pthread_mutex_lock(&c->mu);
    while (!c->stop && c->finished == c->posted) pthread_cond_wait(&c->cv, &c->mu);
    if (c->stop) {
      pthread_mutex_unlock(&c->mu);
      return NULL;
    }
    r = &c->reqs[c->finished % NREQS];
    pthread_mutex_unlock(&c->mu);
    before = r->hdr_done + r->data_done;
    k = move_one(c, r);
    pthread_mutex_lock(&c->mu);
    if (k > 0) {
      r->complete = 1;
      c->finished++;
    } else if (k < 0) {
      c->err = (ncclResult_t)-k;
      c->stop = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (k != 0 || r->hdr_done + r->data_done != before) {
      was_ready = 0;
    } else if (was_ready) {
      /* Ready, yet nothing moved: a departed peer's socket stays readable. A nap. */
      usleep(1000);
      was_ready = 0;
    } else {
      struct pollfd pfd = {c->fd, (short)(r->is_send ? POLLOUT : POLLIN), 0};
      was_ready = poll(&pfd, 1, 1) > 0;
    }
  }
}

static ncclResult_t start_helper(struct comm* c) {
  if (pthread_mutex_init(&c->mu, NULL) || pthread_cond_init(&c->cv, NULL)) return ncclSystemError;
  if (pthread_create(&c->thread, NULL, helper, c)) return ncclSystemError;
  c->helped = 1;
  return ncclSuccess;
}
#define LOCK(c) pthread_mutex_lock(&(c)->mu)
#define UNLOCK(c) pthread_mutex_unlock(&(c)->mu)
#else
static ncclResult_t start_helper(struct comm* c) {
  (void)c;
  return ncclSuccess;
}
#define LOCK(c) ((void)(c))
#define UNLOCK(c) ((void)(c))
#endif

#if MAX_RECVS > 1
/* Reads or writes up to len bytes; 1: done, 0: would block, <0: the error to return. */
static int io(struct comm* c, int sending, void* p, size_t len, size_t* done, int idle_ok) {
  while (*done < len) {
    ssize_t n = sending ? send(c->fd, (char*)p + *done, len - *done, MSG_NOSIGNAL)
                        : recv(c->fd, (char*)p + *done, len - *done, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    /* A peer gone between messages is a departure, not an error: requests stay pending (and
     * room offered to it is forgotten). */
    if ((n == 0 || (n < 0 && (errno == EPIPE || errno == ECONNRESET))) && *done == 0 && idle_ok)
      return 0;
    if (n <= 0) return -(int)ncclRemoteError;
    *done += n;
  }
  return 1;
}

/* Sender: takes in clear-to-send entries, then sends posted messages in order. */
static ncclResult_t progress_send_tagged(struct comm* c) {
  int k;
  for (;;) {
    k = io(c, 0, &c->cts_in, sizeof c->cts_in, &c->cts_in_done, 1);
    if (k < 0) return (ncclResult_t)-k;
    if (k == 0) break;
    if (c->ncts == NCTS) return ncclInternalError; /* more room offered than posted */
    c->cts[c->ncts++] = c->cts_in;
    c->cts_in_done = 0;
  }
  while (c->finished < c->posted) {
    struct req* r = &c->reqs[c->finished % NREQS];
    struct frame f = {r->tag, 0, r->hdr};
    if (r->hdr_done < sizeof f) {
      /* The frame goes out whole or not at all (a partial frame is finished below). */
      k = io(c, 1, (char*)&f, sizeof f, &r->hdr_done, 0);
      if (k <= 0) return k < 0 ? (ncclResult_t)-k : ncclSuccess;
    }
    k = io(c, 1, r->data, r->hdr, &r->data_done, 0);
    if (k <= 0) return k < 0 ? (ncclResult_t)-k : ncclSuccess;
    r->complete = 1;
    c->finished++;
  }
  return ncclSuccess;
}

/* The oldest posted receive with an unmatched buffer of `tag` (its index in *b). */
static struct req* match(struct comm* c, int tag, int* b) {
  struct req* best = NULL;
  int i, j;
  for (i = 0; i < NREQS; i++) {
    struct req* r = &c->reqs[i];
    if (!r->used || r->complete || (best && r->seq > best->seq)) continue;
    for (j = 0; j < r->n; j++) {
      if (!r->matched[j] && r->tags[j] == tag) {
        best = r;
        *b = j;
        break;
      }
    }
  }
  return best;
}

/* Receiver: writes clear-to-send entries, then reads frames into the buffers of their tags. */
static ncclResult_t progress_recv_tagged(struct comm* c) {
  int k;
  if (c->cts_out_len) {
    size_t done = 0;
    k = io(c, 1, c->cts_out, c->cts_out_len, &done, 1);
    if (k < 0) return (ncclResult_t)-k;
    memmove(c->cts_out, c->cts_out + done, c->cts_out_len - done);
    c->cts_out_len -= done;
  }
  for (;;) {
    if (!c->rreq) {
      k = io(c, 0, &c->rframe, sizeof c->rframe, &c->rframe_done, 1);
      if (k <= 0) return k < 0 ? (ncclResult_t)-k : ncclSuccess;
      c->rreq = match(c, c->rframe.tag, &c->rbuf);
      if (!c->rreq) {
        LOG(NCCL_LOG_WARN, PLUGIN_NAME ": a message of tag %d without a receive posted for it",
            c->rframe.tag);
        return ncclInternalError;
      }
      if (c->rframe.len > c->rreq->caps[c->rbuf]) {
        LOG(NCCL_LOG_WARN, PLUGIN_NAME ": a %lu-byte message for a %lu-byte buffer",
            (unsigned long)c->rframe.len, (unsigned long)c->rreq->caps[c->rbuf]);
        return ncclInternalError;
      }
      c->rreq->matched[c->rbuf] = 1;
      c->rdone = 0;
    }
    k = io(c, 0, c->rreq->bufs[c->rbuf], c->rframe.len, &c->rdone, 0);
    if (k <= 0) return k < 0 ? (ncclResult_t)-k : ncclSuccess;
    if (c->rreq->dmr[c->rbuf]) {
      /* Landed in staging: into the GPU before the request says it is done. */
      ncclResult_t rc = gpu_copy(&c->stream, c->rreq->dmr[c->rbuf], 1, c->rreq->dst[c->rbuf],
                                 c->rreq->bufs[c->rbuf], c->rframe.len);
      if (rc != ncclSuccess) return rc;
    }
    c->rreq->lens[c->rbuf] = c->rframe.len;
    if (++c->rreq->nfull == c->rreq->n) c->rreq->complete = 1;
    c->rreq = NULL;
    c->rframe_done = 0;
  }
}
#endif

/* Moves what can move now (called with the comm's lock held). With a helper thread, that
 * thread moves the bytes: this wakes it and reports its error, if any. */
static ncclResult_t progress_any(struct comm* c) {
#if MAX_RECVS > 1
  return c->is_send ? progress_send_tagged(c) : progress_recv_tagged(c);
#elif defined(HELPER_THREAD)
  pthread_cond_signal(&c->cv);
  return c->err;
#else
  return progress(c);
#endif
}

static ncclResult_t isend_locked(void* send_comm, void* data, size_t size, int tag,
                                 void* mhandle, void** request) {
  struct comm* c = send_comm;
  struct req* r;
  const struct gpu_mr* g = as_gpu_mr(mhandle);
  *request = NULL;
  if (!valid_mh(mhandle)) return ncclInternalError;
#if MAX_RECVS > 1
  {
    /* Only into room the receiver offered: the oldest entry of this tag. */
    int i;
    ncclResult_t rc = progress_send_tagged(c);
    if (rc != ncclSuccess) return rc;
    for (i = 0; i < c->ncts && c->cts[i].tag != tag; i++) {}
    if (i == c->ncts) return ncclSuccess; /* not yet: try again later */
    if (size > c->cts[i].len) {
      LOG(NCCL_LOG_WARN, PLUGIN_NAME ": a %lu-byte send of tag %d into %lu bytes",
          (unsigned long)size, tag, (unsigned long)c->cts[i].len);
      return ncclInternalError;
    }
    r = next_slot(c);
    if (!r) return ncclSuccess;
    memmove(&c->cts[i], &c->cts[i + 1], (c->ncts - i - 1) * sizeof c->cts[0]);
    c->ncts--;
  }
#else
  (void)tag;
  r = next_slot(c);
  if (!r) return ncclSuccess; /* try again later */
#endif
  r->is_send = 1;
  r->data = data;
  if (g) {
    /* Device memory goes out from a host copy, taken now (the step is published). */
    char* st = stage_for(c, r, 0, size);
    ncclResult_t rc = st ? gpu_copy(&c->stream, g, 0, data, st, size) : ncclSystemError;
    if (rc != ncclSuccess) {
      r->used = 0;
      c->posted--;
      return rc;
    }
    r->data = st;
  }
  r->cap = size;
  r->hdr = size;
  r->tag = tag;
  *request = r;
  return progress_any(c);
}

static ncclResult_t irecv_locked(void* recv_comm, int n, void** data, const size_t* sizes,
                                 const int* tags, void** mhandles, void** request) {
  struct comm* c = recv_comm;
  struct req* r;
  char* land[MAX_RECVS];
  int i;
  *request = NULL;
  if (n < 1 || n > MAX_RECVS) return ncclInternalError;
  for (i = 0; i < n; i++)
    if (!valid_mh(mhandles[i])) return ncclInternalError;
  r = next_slot(c);
  if (!r) return ncclSuccess;
  for (i = 0; i < n; i++) {
    /* Where each buffer's bytes land: device memory's in host staging, copied on arrival. */
    land[i] = data[i];
    r->dmr[i] = as_gpu_mr(mhandles[i]);
    if (r->dmr[i]) {
      land[i] = stage_for(c, r, i, sizes[i]);
      if (!land[i]) {
        r->used = 0;
        c->posted--;
        return ncclSystemError;
      }
      r->dst[i] = data[i];
    }
  }
  for (i = 0; i < n; i++) {
    if (mhandles[i] == MH_HOST) stats.recv_host++; else stats.recv_cuda++;
  }
  if (n > 1) stats.recv_multi++;
  if ((unsigned long)n > stats.recv_max_n) stats.recv_max_n = n;
  r->data = land[0];
  r->cap = sizes[0];
#if MAX_RECVS > 1
  r->seq = c->posted;
  r->n = n;
  for (i = 0; i < n; i++) {
    struct frame f = {tags[i], 0, sizes[i]};
    r->bufs[i] = land[i];
    r->caps[i] = sizes[i];
    r->tags[i] = tags[i];
    if (c->cts_out_len + sizeof f > sizeof c->cts_out) return ncclInternalError;
    memcpy(c->cts_out + c->cts_out_len, &f, sizeof f);
    c->cts_out_len += sizeof f;
  }
#else
  (void)tags;
#endif
  *request = r;
  return progress_any(c);
}

/* Posting takes the comm's lock (with a helper thread). */
static ncclResult_t do_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                             void** request) {
  struct comm* c = send_comm;
  ncclResult_t rc;
  LOCK(c);
  rc = isend_locked(send_comm, data, size, tag, mhandle, request);
  UNLOCK(c);
  return rc;
}

static ncclResult_t do_irecv(void* recv_comm, int n, void** data, const size_t* sizes,
                             const int* tags, void** mhandles, void** request) {
  struct comm* c = recv_comm;
  ncclResult_t rc;
  LOCK(c);
  rc = irecv_locked(recv_comm, n, data, sizes, tags, mhandles, request);
  UNLOCK(c);
  return rc;
}

static ncclResult_t pl_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                              void** request) {
  struct req* r;
  (void)data; (void)sizes;
  *request = NULL;
  if (n < 1 || !mhandles || !valid_mh(mhandles[0])) return ncclInternalError;
  if (mhandles[0] == MH_HOST) {
    stats.flush_host++; /* host memory: nothing to flush (nccl-rs should not ask) */
    return ncclSuccess;
  }
  stats.flush_cuda++;
  /* The simulator's GPU memory is host memory, and a receive into device memory completes
   * only once its copy into the GPU finished: the flush is done at once, reported by test. */
  r = calloc(1, sizeof *r);
  if (!r) return ncclSystemError;
  r->used = 1;
  r->is_flush = 1;
  r->complete = 1;
  r->comm = recv_comm;
  *request = r;
  return ncclSuccess;
}

static ncclResult_t pl_test(void* request, int* done, int* sizes) {
  struct req* r = request;
  ncclResult_t rc;
  if (!r || !r->used) return ncclInternalError;
  if (r->is_flush) {
    *done = 1;
    if (sizes) sizes[0] = 0;
    free(r);
    return ncclSuccess;
  }
  LOCK(r->comm);
  rc = progress_any(r->comm);
  *done = r->complete;
  UNLOCK(r->comm);
  if (rc != ncclSuccess) return rc;
  if (*done) {
    /* (untagged, with a helper thread) a receive into device memory goes into the GPU here. */
    rc = land_in_gpu(r->comm, r);
    if (rc != ncclSuccess) return rc;
#if MAX_RECVS > 1
    if (sizes && !r->is_send) {
      int i;
      for (i = 0; i < r->n; i++) sizes[i] = (int)r->lens[i];
    } else
#endif
    if (sizes) sizes[0] = (int)(r->is_send ? r->cap : r->hdr);
    LOCK(r->comm);
    r->used = 0;
    UNLOCK(r->comm);
  }
  return ncclSuccess;
}

static ncclResult_t pl_close(void* comm) {
  struct comm* c = comm;
  int i, j;
  if (!c) return ncclSuccess;
#ifdef HELPER_THREAD
  if (c->helped) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
  }
#endif
  close(c->fd);
#ifdef CUDA_PTR
  if (c->stream && cu.loaded) cu.stream_destroy(c->stream);
#endif
  for (i = 0; i < NREQS; i++)
    for (j = 0; j < MAX_RECVS; j++) free(c->stage[i][j].p);
  free(c);
  write_stats();
  return ncclSuccess;
}

static ncclResult_t pl_close_listen(void* listen_comm) {
  struct listen_comm* lc = listen_comm;
  close(lc->fd);
  free(lc);
  return ncclSuccess;
}

static ncclResult_t pl_get_device_mr(void* comm, void* mhandle, void** dptr) {
  (void)comm; (void)mhandle; *dptr = NULL;
  return ncclInternalError;
}

static ncclResult_t pl_irecv_consumed(void* recv_comm, int n, void* request) {
  (void)recv_comm; (void)n; (void)request;
  return ncclSuccess;
}

static ncclResult_t common_init(ncclDebugLogger_t logfn) {
  logf_ = logfn;
#ifdef CUDA_PTR
  cuda_load();
#endif
#ifdef FAIL_INIT
  LOG(NCCL_LOG_WARN, PLUGIN_NAME ": failing init on purpose (v%d)", NET_VERSION);
  return ncclSystemError;
#else
  LOG(NCCL_LOG_INFO, PLUGIN_NAME ": init v%d, %d device on %s", NET_VERSION, 1, "127.0.0.1");
  return ncclSuccess;
#endif
}

/* ---- properties ---- */
#if NET_VERSION == 8
static ncclResult_t pl_get_properties(int dev, ncclNetProperties_v8_t* p) {
#elif NET_VERSION == 11
static ncclResult_t pl_get_properties(int dev, ncclNetProperties_v11_t* p) {
#else
static ncclResult_t pl_get_properties(int dev, ncclNetProperties_v9_t* p) {
#endif
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  p->name = "lo-test";
  p->pciPath = NULL;
  p->guid = 0x7465737400000000ull;
#if defined(CUDA_PTR) && defined(DMABUF)
  p->ptrSupport = NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF;
#elif defined(CUDA_PTR)
  p->ptrSupport = NCCL_PTR_HOST | NCCL_PTR_CUDA;
#else
  p->ptrSupport = NCCL_PTR_HOST;
#endif
  p->speed = SPEED;
  p->port = 1;
  p->latency = 1.5f;
  p->maxComms = 65536;
  p->maxRecvs = MAX_RECVS;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
#if NET_VERSION >= 9
#ifdef FORCE_FLUSH
  p->forceFlush = 1;
#endif
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = 0;
  p->maxP2pBytes = (size_t)1 << 30;
  p->maxCollBytes = (size_t)1 << 30;
#endif
#if NET_VERSION >= 11
  p->maxMultiRequestSize = 1;
#endif
  return ncclSuccess;
}

/* ---- the table of each version ---- */
#if NET_VERSION == 8
static ncclResult_t pl_init(ncclDebugLogger_t logfn) { return common_init(logfn); }
static ncclResult_t pl_listen(int dev, void* h, void** l) { return do_listen(dev, h, l); }
static ncclResult_t pl_connect(int dev, void* h, void** s, ncclNetDeviceHandle_t** d) {
  if (d) *d = NULL;
  return do_connect(dev, h, s);
}
static ncclResult_t pl_isend(void* s, void* data, int size, int tag, void* mh, void** req) {
  if (size < 0) return ncclInternalError;
  return do_isend(s, data, (size_t)size, tag, mh, req);
}
static ncclResult_t pl_irecv(void* r, int n, void** data, int* sizes, int* tags, void** mh,
                             void** req) {
  size_t sz[MAX_RECVS];
  int i;
  if (n < 1 || n > MAX_RECVS) return ncclInternalError;
  for (i = 0; i < n; i++) {
    if (sizes[i] < 0) return ncclInternalError;
    sz[i] = (size_t)sizes[i];
  }
  return do_irecv(r, n, data, sz, tags, mh, req);
}
#define TABLE_TYPE ncclNet_v8_t
#define TABLE_SYMBOL ncclNetPlugin_v8
#elif NET_VERSION == 9
static ncclResult_t pl_init(ncclDebugLogger_t logfn) { return common_init(logfn); }
static ncclResult_t pl_listen(int dev, void* h, void** l) { return do_listen(dev, h, l); }
static ncclResult_t pl_connect(int dev, void* h, void** s, ncclNetDeviceHandle_t** d) {
  if (d) *d = NULL;
  return do_connect(dev, h, s);
}
static ncclResult_t pl_isend(void* s, void* data, size_t size, int tag, void* mh, void** req) {
  return do_isend(s, data, size, tag, mh, req);
}
static ncclResult_t pl_irecv(void* r, int n, void** data, size_t* sizes, int* tags, void** mh,
                             void** req) {
  return do_irecv(r, n, data, sizes, tags, mh, req);
}
#define TABLE_TYPE ncclNet_v9_t
#define TABLE_SYMBOL ncclNetPlugin_v9
#elif NET_VERSION == 10
static ncclResult_t pl_init(ncclDebugLogger_t logfn, ncclProfilerCallback_t prof) {
  (void)prof;
  return common_init(logfn);
}
static ncclResult_t pl_listen(int dev, void* h, void** l) { return do_listen(dev, h, l); }
static ncclResult_t pl_connect(int dev, ncclNetCommConfig_t* cfg, void* h, void** s,
                               ncclNetDeviceHandle_t** d) {
  if (!cfg) return ncclInternalError;
  if (d) *d = NULL;
  return do_connect(dev, h, s);
}
static ncclResult_t pl_isend(void* s, void* data, size_t size, int tag, void* mh, void* ph,
                             void** req) {
  (void)ph;
  return do_isend(s, data, size, tag, mh, req);
}
static ncclResult_t pl_irecv(void* r, int n, void** data, size_t* sizes, int* tags, void** mh,
                             void** ph, void** req) {
  (void)ph;
  return do_irecv(r, n, data, sizes, tags, mh, req);
}
#define TABLE_TYPE ncclNet_v10_t
#define TABLE_SYMBOL ncclNetPlugin_v10
#else
static int ctx_count = 0; /* contexts alive */
struct context {
  uint32_t magic;
  uint64_t comm_id;
};
static ncclResult_t pl_init(void** ctx, uint64_t comm_id, ncclNetCommConfig_t* cfg,
                            ncclDebugLogger_t logfn, ncclProfilerCallback_t prof) {
  struct context* c;
  ncclResult_t rc;
  (void)prof;
  if (!cfg) return ncclInternalError;
  rc = common_init(logfn);
  if (rc != ncclSuccess) return rc;
  c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->magic = MAGIC;
  c->comm_id = comm_id;
  *ctx = c;
  ctx_count++;
  LOG(NCCL_LOG_INFO, PLUGIN_NAME ": context for comm %llx (%d alive)",
      (unsigned long long)comm_id, ctx_count);
  return ncclSuccess;
}
static ncclResult_t pl_finalize(void* ctx) {
  struct context* c = ctx;
  if (!c || c->magic != MAGIC) return ncclInternalError;
  ctx_count--;
  LOG(NCCL_LOG_INFO, PLUGIN_NAME ": finalized comm %llx (%d alive)",
      (unsigned long long)c->comm_id, ctx_count);
  c->magic = 0;
  free(c);
  return ncclSuccess;
}
static ncclResult_t pl_set_net_attr(void* ctx, ncclNetAttr_v11_t* attr) {
  struct context* c = ctx;
  if (!c || c->magic != MAGIC || !attr) return ncclInternalError;
  return ncclSuccess;
}
static ncclResult_t pl_listen(void* ctx, int dev, void* h, void** l) {
  struct context* c = ctx;
  if (!c || c->magic != MAGIC) return ncclInternalError;
  return do_listen(dev, h, l);
}
static ncclResult_t pl_connect(void* ctx, int dev, void* h, void** s, ncclNetDeviceHandle_t** d) {
  struct context* c = ctx;
  if (!c || c->magic != MAGIC) return ncclInternalError;
  if (d) *d = NULL;
  return do_connect(dev, h, s);
}
static ncclResult_t pl_isend(void* s, void* data, size_t size, int tag, void* mh, void* ph,
                             void** req) {
  (void)ph;
  return do_isend(s, data, size, tag, mh, req);
}
static ncclResult_t pl_irecv(void* r, int n, void** data, size_t* sizes, int* tags, void** mh,
                             void** ph, void** req) {
  (void)ph;
  return do_irecv(r, n, data, sizes, tags, mh, req);
}
#define TABLE_TYPE ncclNet_v11_t
#define TABLE_SYMBOL ncclNetPlugin_v11
#endif

#ifdef NO_SYMBOL
#undef TABLE_SYMBOL
#define TABLE_SYMBOL someOtherTableName
#endif

#if NET_VERSION >= 9
static ncclResult_t pl_make_vdevice(int* d, ncclNetVDeviceProps_t* props) {
  (void)d; (void)props;
  return ncclInvalidUsage; /* one physical device: nothing to merge */
}
#endif

__attribute__((visibility("default"))) const TABLE_TYPE TABLE_SYMBOL = {
  PLUGIN_NAME,
  pl_init,
  pl_devices,
  pl_get_properties,
  pl_listen,
  pl_connect,
  pl_accept,
  pl_reg_mr,
  pl_reg_mr_dmabuf,
  pl_dereg_mr,
  pl_isend,
  pl_irecv,
  pl_iflush,
  pl_test,
  pl_close,
  pl_close,
  pl_close_listen,
  pl_get_device_mr,
  pl_irecv_consumed,
#if NET_VERSION >= 9
  pl_make_vdevice,
#endif
#if NET_VERSION >= 11
  pl_finalize,
  pl_set_net_attr,
#endif
};

#ifdef WITH_COLLNET
__attribute__((visibility("default"))) const ncclCollNetHead_t ncclCollNetPlugin_v8 = {
  PLUGIN_NAME "-collnet"
};
#endif
