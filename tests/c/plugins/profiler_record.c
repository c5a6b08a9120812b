/*
 * A profiler plugin for nccl-rs's tests, written against include/nccl_profiler.h: it writes
 * every callback it gets as one text line, so that a test can check which events nccl-rs
 * emits, with which fields, parents and states.
 *
 * Build (one table per library):
 *   cc -shared -fPIC -O2 -Wall -Werror -I include -DPROFILER_VERSION=N \
 *      -o libx.so tests/c/plugins/profiler_record.c -ldl -lpthread
 * with N = 4, 5 or 6 (default 6). The library exports one symbol, ncclProfiler_vN, named
 * "nccl-rs-test-profiler-vN".
 *
 * Environment:
 *   NCCL_RS_TEST_PROFILER_MASK       the activation mask init sets (strtol base 0; unset: 0)
 *   NCCL_RS_TEST_PROFILER_OUT        path prefix: each communicator appends to
 *                                    <OUT>-<commHash, 16 hex digits>-<rank>.log; unset: init
 *                                    succeeds and nothing is written
 *   NCCL_RS_TEST_PROFILER_FAIL_INIT  1: init returns ncclInternalError (3), sets no context,
 *                                    leaves the mask alone and opens nothing
 *
 * Lines (each written under the communicator's mutex and flushed at once):
 *   init v=N comm=<16 hex> name=<commName or -> nodes=<n> nranks=<n> rank=<n> mask=<n>
 *   start h=<id> type=<Name> parent=<parent id or 0> rank=<n> <type fields>
 *   stop h=<id>
 *   record h=<id> state=<n> arg=<the 8 bytes of *args as unsigned long long, 0 if NULL>
 *   finalize comm=<16 hex>
 * Handles are event records numbered from 1 across the process; they stay valid (and keep
 * their number) until the communicator's finalize. A parentObj this plugin did not hand out
 * prints as parent=bad:<pointer>; the parent of a ProxyOp posted by another process (pid not
 * ours, PXN) is not looked at and prints as parent=foreign:<pointer>. A stop or record with
 * a NULL handle has no communicator: its line (h=0) goes to every open log.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_profiler.h"

#ifndef PROFILER_VERSION
#define PROFILER_VERSION 6
#endif
#if PROFILER_VERSION != 4 && PROFILER_VERSION != 5 && PROFILER_VERSION != 6
#error "PROFILER_VERSION must be 4, 5 or 6"
#endif

#define PR_STR2(x) #x
#define PR_STR(x) PR_STR2(x)
#define PR_CAT3_(a, b, c) a##b##c
#define PR_CAT3(a, b, c) PR_CAT3_(a, b, c)

/* The version's types and exported name. */
#define PR_DESCR_T PR_CAT3(ncclProfilerEventDescr_v, PROFILER_VERSION, _t)
#define PR_STATE_T PR_CAT3(ncclProfilerEventState_v, PROFILER_VERSION, _t)
#define PR_ARGS_T PR_CAT3(ncclProfilerEventStateArgs_v, PROFILER_VERSION, _t)
#define PR_TABLE_T PR_CAT3(ncclProfiler_v, PROFILER_VERSION, _t)
#define PR_SYMBOL PR_CAT3(ncclProfiler_v, PROFILER_VERSION, )
#define PR_NAME "nccl-rs-test-profiler-v" PR_STR(PROFILER_VERSION)

#define PR_MAGIC 0x70726f66696c6572ULL /* "profiler" */

struct prContext;

/* One event handle. Never freed before its communicator's finalize. */
struct prEvent {
  uint64_t magic;          /* PR_MAGIC while alive */
  uint64_t id;             /* from 1, process-wide */
  int type;                /* descriptor type */
  struct prContext* ctx;   /* the communicator that started it */
  struct prEvent* next;    /* the context's list */
};

/* One communicator (init .. finalize). */
struct prContext {
  FILE* out;               /* NULL: record nothing */
  pthread_mutex_t mutex;   /* guards out and events */
  uint64_t commHash;
  int rank;
  struct prEvent* events;
  struct prContext* next;  /* the open contexts (for NULL-handle lines) */
};

static atomic_ullong prNextId = 1;

static pthread_mutex_t prContextsMutex = PTHREAD_MUTEX_INITIALIZER;
static struct prContext* prContexts = NULL; /* contexts with a log open */

/* Writes one line to ctx's log (nothing if it has none) and flushes it. */
__attribute__((format(printf, 2, 3))) static void prLine(struct prContext* ctx, const char* fmt,
                                                          ...) {
  if (ctx == NULL || ctx->out == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&ctx->mutex);
  vfprintf(ctx->out, fmt, ap);
  fputc('\n', ctx->out);
  fflush(ctx->out);
  pthread_mutex_unlock(&ctx->mutex);
  va_end(ap);
}

/* Writes one line to every open log (for calls that carry no handle). */
__attribute__((format(printf, 1, 2))) static void prLineAll(const char* fmt, ...) {
  pthread_mutex_lock(&prContextsMutex);
  for (struct prContext* c = prContexts; c != NULL; c = c->next) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->mutex);
    if (c->out != NULL) {
      vfprintf(c->out, fmt, ap);
      fputc('\n', c->out);
      fflush(c->out);
    }
    pthread_mutex_unlock(&c->mutex);
    va_end(ap);
  }
  pthread_mutex_unlock(&prContextsMutex);
}

static const char* prStr(const char* s) { return s != NULL ? s : "(null)"; }

/* "<id>" of a handle this plugin returned, "0" for NULL, "bad:<ptr>" for anything else. */
static void prHandleName(char* buf, size_t len, const void* handle) {
  if (handle == NULL) {
    snprintf(buf, len, "0");
    return;
  }
  const struct prEvent* ev = (const struct prEvent*)handle;
  if (ev->magic != PR_MAGIC) {
    snprintf(buf, len, "bad:%p", handle);
    return;
  }
  snprintf(buf, len, "%llu", (unsigned long long)ev->id);
}

static const char* prTypeName(uint64_t type) {
  switch (type) {
    case ncclProfileGroup: return "Group";
    case ncclProfileColl: return "Coll";
    case ncclProfileP2p: return "P2p";
    case ncclProfileProxyOp: return "ProxyOp";
    case ncclProfileProxyStep: return "ProxyStep";
    case ncclProfileProxyCtrl: return "ProxyCtrl";
    case ncclProfileKernelCh: return "KernelCh";
    case ncclProfileNetPlugin: return "NetPlugin";
#if PROFILER_VERSION >= 5
    case ncclProfileGroupApi: return "GroupApi";
    case ncclProfileCollApi: return "CollApi";
    case ncclProfileP2pApi: return "P2pApi";
    case ncclProfileKernelLaunch: return "KernelLaunch";
#endif
#if PROFILER_VERSION >= 6
    case ncclProfileCeColl: return "CeColl";
    case ncclProfileCeSync: return "CeSync";
    case ncclProfileCeBatch: return "CeBatch";
#endif
    default: return NULL;
  }
}

#if PROFILER_VERSION >= 5
/* Appends to the string in buf (of len bytes). */
__attribute__((format(printf, 3, 4))) static void prAppend(char* buf, size_t len, const char* fmt,
                                                            ...) {
  size_t used = strlen(buf);
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
}
#endif

/* The type-specific part of a start line (empty for Group, ProxyCtrl and unknown types). */
static void prFields(char* buf, size_t len, const PR_DESCR_T* d) {
  buf[0] = '\0';
#if PROFILER_VERSION >= 5
  char pgroup[48];
#endif
  switch (d->type) {
#if PROFILER_VERSION >= 5
    case ncclProfileGroupApi:
      snprintf(buf, len, " depth=%d graph=%d", d->groupApi.groupDepth,
               (int)d->groupApi.graphCaptured);
      break;
    case ncclProfileCollApi:
      snprintf(buf, len, " func=%s count=%zu dtype=%s root=%d stream=%p graph=%d",
               prStr(d->collApi.func), d->collApi.count, prStr(d->collApi.datatype),
               d->collApi.root, d->collApi.stream, (int)d->collApi.graphCaptured);
      break;
    case ncclProfileP2pApi:
      snprintf(buf, len, " func=%s count=%zu dtype=%s stream=%p graph=%d",
               prStr(d->p2pApi.func), d->p2pApi.count, prStr(d->p2pApi.datatype),
               d->p2pApi.stream, (int)d->p2pApi.graphCaptured);
      break;
    case ncclProfileKernelLaunch:
      snprintf(buf, len, " stream=%p", d->kernelLaunch.stream);
      break;
#endif
    case ncclProfileColl:
      snprintf(buf, len,
               " seq=%llu func=%s send=%p recv=%p count=%zu root=%d dtype=%s nch=%u nwarps=%u"
               " algo=%s proto=%s",
               (unsigned long long)d->coll.seqNumber, prStr(d->coll.func), d->coll.sendBuff,
               d->coll.recvBuff, d->coll.count, d->coll.root, prStr(d->coll.datatype),
               (unsigned)d->coll.nChannels, (unsigned)d->coll.nWarps, prStr(d->coll.algo),
               prStr(d->coll.proto));
#if PROFILER_VERSION >= 5
      prHandleName(pgroup, sizeof(pgroup), d->coll.parentGroup);
      prAppend(buf, len, " pgroup=%s", pgroup);
#endif
      break;
    case ncclProfileP2p:
      snprintf(buf, len, " func=%s buff=%p dtype=%s count=%zu peer=%d nch=%u", prStr(d->p2p.func),
               d->p2p.buff, prStr(d->p2p.datatype), d->p2p.count, d->p2p.peer,
               (unsigned)d->p2p.nChannels);
#if PROFILER_VERSION >= 5
      prHandleName(pgroup, sizeof(pgroup), d->p2p.parentGroup);
      prAppend(buf, len, " pgroup=%s", pgroup);
#endif
      break;
    case ncclProfileProxyOp:
      snprintf(buf, len, " pid=%d ch=%u peer=%d steps=%d chunk=%d send=%d", (int)d->proxyOp.pid,
               (unsigned)d->proxyOp.channelId, d->proxyOp.peer, d->proxyOp.nSteps,
               d->proxyOp.chunkSize, d->proxyOp.isSend);
      break;
    case ncclProfileProxyStep:
      snprintf(buf, len, " step=%d", d->proxyStep.step);
      break;
    case ncclProfileKernelCh:
      snprintf(buf, len, " ch=%u ptimer=%llu", (unsigned)d->kernelCh.channelId,
               (unsigned long long)d->kernelCh.pTimer);
      break;
    case ncclProfileNetPlugin:
      snprintf(buf, len, " id=%lld", (long long)d->netPlugin.id);
      break;
#if PROFILER_VERSION >= 6
    case ncclProfileCeColl:
      snprintf(buf, len,
               " seq=%llu func=%s send=%p recv=%p count=%zu root=%d dtype=%s sync=%s batch=%u"
               " nbatches=%u stream=%p",
               (unsigned long long)d->ceColl.seqNumber, prStr(d->ceColl.func),
               d->ceColl.sendBuff, d->ceColl.recvBuff, d->ceColl.count, d->ceColl.root,
               prStr(d->ceColl.datatype), prStr(d->ceColl.syncStrategy),
               (unsigned)d->ceColl.batchSize, (unsigned)d->ceColl.numBatches, d->ceColl.stream);
      break;
    case ncclProfileCeSync:
      snprintf(buf, len, " complete=%d nranks=%d", (int)d->ceCollSync.isComplete,
               d->ceCollSync.nRanks);
      break;
    case ncclProfileCeBatch:
      snprintf(buf, len, " ops=%d bytes=%zu intra=%d", d->ceCollBatch.numOps,
               d->ceCollBatch.totalBytes, (int)d->ceCollBatch.useIntraSync);
      break;
#endif
    default:
      break;
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Callbacks.                                                                                */

static ncclResult_t prInit(void** context, uint64_t commHash, int* eActivationMask,
                           const char* commName, int nNodes, int nranks, int rank,
                           ncclDebugLogger_t logfn) {
  if (context == NULL) return ncclInvalidArgument;
  *context = NULL;

  const char* fail = getenv("NCCL_RS_TEST_PROFILER_FAIL_INIT");
  if (fail != NULL && strcmp(fail, "1") == 0) return ncclInternalError;

  const char* maskEnv = getenv("NCCL_RS_TEST_PROFILER_MASK");
  int mask = maskEnv != NULL ? (int)strtol(maskEnv, NULL, 0) : 0;
  if (eActivationMask != NULL) *eActivationMask = mask;

  struct prContext* ctx = (struct prContext*)calloc(1, sizeof(*ctx));
  if (ctx == NULL) return ncclSystemError;
  pthread_mutex_init(&ctx->mutex, NULL);
  ctx->commHash = commHash;
  ctx->rank = rank;

  const char* prefix = getenv("NCCL_RS_TEST_PROFILER_OUT");
  if (prefix != NULL) {
    size_t len = strlen(prefix) + 64;
    char* path = (char*)malloc(len);
    if (path == NULL) {
      pthread_mutex_destroy(&ctx->mutex);
      free(ctx);
      return ncclSystemError;
    }
    snprintf(path, len, "%s-%016llx-%d.log", prefix, (unsigned long long)commHash, rank);
    ctx->out = fopen(path, "a");
    if (ctx->out == NULL) {
      if (logfn != NULL) {
        logfn(NCCL_LOG_WARN, 0x4000UL /* PROFILE */, __FILE__, __LINE__,
              "%s: cannot open %s: %s", PR_NAME, path, strerror(errno));
      }
      free(path);
      pthread_mutex_destroy(&ctx->mutex);
      free(ctx);
      return ncclSystemError;
    }
    free(path);
    pthread_mutex_lock(&prContextsMutex);
    ctx->next = prContexts;
    prContexts = ctx;
    pthread_mutex_unlock(&prContextsMutex);
  }

  prLine(ctx, "init v=%d comm=%016llx name=%s nodes=%d nranks=%d rank=%d mask=%d",
         PROFILER_VERSION, (unsigned long long)commHash, commName != NULL ? commName : "-",
         nNodes, nranks, rank, mask);
  *context = ctx;
  return ncclSuccess;
}

#if PROFILER_VERSION == 4
static ncclResult_t prInitVersion(void** context, int* eActivationMask, const char* commName,
                                  uint64_t commHash, int nNodes, int nranks, int rank,
                                  ncclDebugLogger_t logfn) {
  return prInit(context, commHash, eActivationMask, commName, nNodes, nranks, rank, logfn);
}
#else
static ncclResult_t prInitVersion(void** context, uint64_t commId, int* eActivationMask,
                                  const char* commName, int nNodes, int nranks, int rank,
                                  ncclDebugLogger_t logfn) {
  return prInit(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);
}
#endif

static ncclResult_t prStartEvent(void* context, void** eHandle, PR_DESCR_T* eDescr) {
  if (eHandle == NULL) return ncclSuccess;
  struct prContext* ctx = (struct prContext*)context;
  if (ctx == NULL || eDescr == NULL) {
    *eHandle = NULL;
    return ncclSuccess;
  }

  struct prEvent* ev = (struct prEvent*)calloc(1, sizeof(*ev));
  if (ev == NULL) {
    *eHandle = NULL;
    return ncclSuccess;
  }
  ev->magic = PR_MAGIC;
  ev->id = (uint64_t)atomic_fetch_add(&prNextId, 1);
  ev->type = (int)eDescr->type;
  ev->ctx = ctx;
  pthread_mutex_lock(&ctx->mutex);
  ev->next = ctx->events;
  ctx->events = ev;
  pthread_mutex_unlock(&ctx->mutex);
  *eHandle = ev;

  char typeBuf[32];
  const char* name = prTypeName(eDescr->type);
  if (name == NULL) {
    snprintf(typeBuf, sizeof(typeBuf), "Unknown%llu", (unsigned long long)eDescr->type);
    name = typeBuf;
  }

  char parent[48];
  if (eDescr->type == ncclProfileProxyOp && eDescr->parentObj != NULL &&
      eDescr->proxyOp.pid != getpid()) {
    snprintf(parent, sizeof(parent), "foreign:%p", eDescr->parentObj);
  } else {
    prHandleName(parent, sizeof(parent), eDescr->parentObj);
  }

  char fields[1024];
  prFields(fields, sizeof(fields), eDescr);
  prLine(ctx, "start h=%llu type=%s parent=%s rank=%d%s", (unsigned long long)ev->id, name,
         parent, eDescr->rank, fields);
  return ncclSuccess;
}

static ncclResult_t prStopEvent(void* eHandle) {
  struct prEvent* ev = (struct prEvent*)eHandle;
  if (ev == NULL) {
    prLineAll("stop h=0");
    return ncclSuccess;
  }
  prLine(ev->ctx, "stop h=%llu", (unsigned long long)ev->id);
  return ncclSuccess;
}

static ncclResult_t prRecordEventState(void* eHandle, PR_STATE_T eState, PR_ARGS_T* eStateArgs) {
  unsigned long long arg = 0;
  if (eStateArgs != NULL) memcpy(&arg, eStateArgs, sizeof(arg));
  struct prEvent* ev = (struct prEvent*)eHandle;
  if (ev == NULL) {
    prLineAll("record h=0 state=%d arg=%llu", (int)eState, arg);
    return ncclSuccess;
  }
  prLine(ev->ctx, "record h=%llu state=%d arg=%llu", (unsigned long long)ev->id, (int)eState,
         arg);
  return ncclSuccess;
}

static ncclResult_t prFinalize(void* context) {
  struct prContext* ctx = (struct prContext*)context;
  if (ctx == NULL) return ncclSuccess;

  pthread_mutex_lock(&prContextsMutex);
  for (struct prContext** p = &prContexts; *p != NULL; p = &(*p)->next) {
    if (*p == ctx) {
      *p = ctx->next;
      break;
    }
  }
  pthread_mutex_unlock(&prContextsMutex);

  prLine(ctx, "finalize comm=%016llx", (unsigned long long)ctx->commHash);

  pthread_mutex_lock(&ctx->mutex);
  if (ctx->out != NULL) fclose(ctx->out);
  ctx->out = NULL;
  struct prEvent* ev = ctx->events;
  ctx->events = NULL;
  pthread_mutex_unlock(&ctx->mutex);
  while (ev != NULL) {
    struct prEvent* next = ev->next;
    ev->magic = 0;
    free(ev);
    ev = next;
  }
  pthread_mutex_destroy(&ctx->mutex);
  free(ctx);
  return ncclSuccess;
}

/* The one exported symbol. */
__attribute__((visibility("default"))) PR_TABLE_T PR_SYMBOL = {
    PR_NAME, prInitVersion, prStartEvent, prStopEvent, prRecordEventState, prFinalize,
};
