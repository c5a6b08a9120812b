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
 *   CUDA_PTR               claim NCCL_PTR_CUDA too: regMr takes GPU memory (on nccl-rs's
 *                          simulator GPU memory is host memory, so send/recv copy it as is);
 *                          iflush of a GPU region returns a request that test() completes
 *   FORCE_FLUSH            the forceFlush property (v9 on)
 *   SPEED=n                the speed property, Mb/s (default 12345)
 *
 * Counters: with TEST_PLUGIN_STATS=<path> in the environment, every close of a comm writes the
 * process's registrations by type, receives posted into GPU and host regions (per buffer),
 * flushes (of GPU and of host regions), irecv calls of more than one buffer and the largest
 * n seen, and comms opened, to <path>.<pid>, for the tests to read.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/* Memory handles: which kind of region was registered. */
#define MH_HOST ((void*)(uintptr_t)0x1234)
#define MH_CUDA ((void*)(uintptr_t)0x1235)

static struct {
  unsigned long reg_host, reg_cuda, reg_dmabuf, recv_host, recv_cuda, flush_cuda, flush_host;
  unsigned long recv_multi, recv_max_n, comms;
} stats;

#define MAGIC 0x6e636e74u /* "tncn" */
#define NREQS NCCL_NET_MAX_REQUESTS

static ncclDebugLogger_t logf_ = NULL;

#define LOG(level, ...) \
  do { if (logf_) logf_(level, 16 /* NET */, __FILE__, __LINE__, __VA_ARGS__); } while (0)

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
};

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
  fprintf(f, "reg_host=%lu reg_cuda=%lu reg_dmabuf=%lu recv_host=%lu recv_cuda=%lu flush_cuda=%lu flush_host=%lu recv_multi=%lu recv_max_n=%lu comms=%lu\n",
          stats.reg_host, stats.reg_cuda, stats.reg_dmabuf, stats.recv_host, stats.recv_cuda,
          stats.flush_cuda, stats.flush_host, stats.recv_multi, stats.recv_max_n, stats.comms);
  fclose(f);
}

static ncclResult_t pl_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm; (void)size;
  if (!data) return ncclInternalError;
  if (type == NCCL_PTR_HOST) {
    stats.reg_host++;
    *mhandle = MH_HOST;
    return ncclSuccess;
  }
#ifdef CUDA_PTR
  if (type == NCCL_PTR_CUDA) {
    stats.reg_cuda++;
    *mhandle = MH_CUDA;
    return ncclSuccess;
  }
#endif
  return ncclInternalError; /* a kind of memory this flavour does not take */
}

static ncclResult_t pl_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                     uint64_t offset, int fd, void** mhandle) {
  (void)comm; (void)data; (void)size; (void)type; (void)offset; (void)fd; (void)mhandle;
  stats.reg_dmabuf++;
  return ncclInternalError; /* no dmabuf support claimed */
}

static ncclResult_t pl_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
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

/* Moves bytes of the oldest unfinished requests; an error is fatal to the comm. */
__attribute__((unused)) static ncclResult_t progress(struct comm* c) {
  while (c->finished < c->posted) {
    struct req* r = &c->reqs[c->finished % NREQS];
    while (r->hdr_done < sizeof r->hdr) {
      ssize_t n = r->is_send
          ? send(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, MSG_NOSIGNAL)
          : recv(c->fd, (char*)&r->hdr + r->hdr_done, sizeof r->hdr - r->hdr_done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      /* A peer gone between messages is a departure, not an error: receives stay pending. */
      if (n == 0 && r->hdr_done == 0) return ncclSuccess;
      if (n <= 0) return ncclRemoteError;
      r->hdr_done += n;
      if (r->hdr_done == sizeof r->hdr && !r->is_send && r->hdr > r->cap) {
        LOG(NCCL_LOG_WARN, PLUGIN_NAME ": a %lu-byte message for a %lu-byte buffer",
            (unsigned long)r->hdr, (unsigned long)r->cap);
        return ncclInternalError;
      }
    }
    while (r->data_done < r->hdr) {
      ssize_t n = r->is_send
          ? send(c->fd, r->data + r->data_done, r->hdr - r->data_done, MSG_NOSIGNAL)
          : recv(c->fd, r->data + r->data_done, r->hdr - r->data_done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      if (n <= 0) return ncclRemoteError;
      r->data_done += n;
    }
    r->complete = 1;
    c->finished++;
  }
  return ncclSuccess;
}

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
    c->rreq->lens[c->rbuf] = c->rframe.len;
    if (++c->rreq->nfull == c->rreq->n) c->rreq->complete = 1;
    c->rreq = NULL;
    c->rframe_done = 0;
  }
}
#endif

static ncclResult_t progress_any(struct comm* c) {
#if MAX_RECVS > 1
  return c->is_send ? progress_send_tagged(c) : progress_recv_tagged(c);
#else
  return progress(c);
#endif
}

static ncclResult_t do_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                             void** request) {
  struct comm* c = send_comm;
  struct req* r;
  *request = NULL;
  if (mhandle != MH_HOST && mhandle != MH_CUDA) return ncclInternalError;
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
  r->cap = size;
  r->hdr = size;
  r->tag = tag;
  *request = r;
  return progress_any(c);
}

static ncclResult_t do_irecv(void* recv_comm, int n, void** data, const size_t* sizes,
                             const int* tags, void** mhandles, void** request) {
  struct comm* c = recv_comm;
  struct req* r;
  int i;
  *request = NULL;
  if (n < 1 || n > MAX_RECVS) return ncclInternalError;
  for (i = 0; i < n; i++)
    if (mhandles[i] != MH_HOST && mhandles[i] != MH_CUDA) return ncclInternalError;
  r = next_slot(c);
  if (!r) return ncclSuccess;
  for (i = 0; i < n; i++) {
    if (mhandles[i] == MH_CUDA) stats.recv_cuda++; else stats.recv_host++;
  }
  if (n > 1) stats.recv_multi++;
  if ((unsigned long)n > stats.recv_max_n) stats.recv_max_n = n;
  r->data = data[0];
  r->cap = sizes[0];
#if MAX_RECVS > 1
  r->seq = c->posted;
  r->n = n;
  for (i = 0; i < n; i++) {
    struct frame f = {tags[i], 0, sizes[i]};
    r->bufs[i] = data[i];
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

static ncclResult_t pl_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                              void** request) {
  struct req* r;
  (void)data; (void)sizes;
  *request = NULL;
  if (n < 1 || !mhandles) return ncclInternalError;
  if (mhandles[0] != MH_CUDA) {
    stats.flush_host++; /* host memory: nothing to flush (nccl-rs should not ask) */
    return ncclSuccess;
  }
  stats.flush_cuda++;
  /* The simulator's GPU memory is host memory: the flush is done at once, reported by test. */
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
  rc = progress_any(r->comm);
  if (rc != ncclSuccess) return rc;
  *done = r->complete;
  if (r->complete) {
#if MAX_RECVS > 1
    if (sizes && !r->is_send) {
      int i;
      for (i = 0; i < r->n; i++) sizes[i] = (int)r->lens[i];
    } else
#endif
    if (sizes) sizes[0] = (int)(r->is_send ? r->cap : r->hdr);
    r->used = 0;
  }
  return ncclSuccess;
}

static ncclResult_t pl_close(void* comm) {
  struct comm* c = comm;
  if (!c) return ncclSuccess;
  close(c->fd);
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
#ifdef CUDA_PTR
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
