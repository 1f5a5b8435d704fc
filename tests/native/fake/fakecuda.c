/*
 * A fake libcuda.so.1 for tests: the documented driver-API semantics of the calls gpuops
 * intercepts, on top of a "GPU" shared by every process through fakegpu.h.
 *
 * - Memory: each device has a fixed size; allocations across all processes are accounted in the
 *   shared state, and memory of dead processes is returned (as the real driver does on exit).
 * - Execution: every context's work goes through one in-order queue per (process, device),
 *   served by a worker thread.  A kernel reserves the device's shared timeline for the duration
 *   given by its first parameter (a pointer to a uint64 nanosecond count), so kernels of all
 *   processes run one at a time; launches are asynchronous, the queue holds at most 1024
 *   operations, and events get the GPU time at which all preceding work of their queue ended.
 * - cuGetProcAddress/_v2 resolve names by requested CUDA version and per-thread-stream flag.
 * - FAKECUDA_CALLS=FILE: at exit the process appends "PID NAME COUNT" lines, the number of calls
 *   it made to each event function and launch path (on a real driver each event call costs about
 *   as much as a launch, so tests bound how many the limiter makes per launch).
 */
#define _GNU_SOURCE
#include "fakegpu.h"

#include "../../../native/include/gpuops_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define QCAP 1024
#define LOOKAHEAD_NS 300000ull

enum { M_CTX = 0x43545831, M_STREAM, M_EVENT, M_MOD, M_FUNC, M_GRAPH, M_EXEC, M_ARRAY, M_MIPMAP, M_POOL };

struct CUctx_st { uint32_t magic; int dev; int primary; int refs; };
struct CUstream_st { uint32_t magic; struct CUctx_st *ctx; uint64_t last_seq; int used; };
struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    int dev;
    int recorded;
    uint64_t seq;
    _Atomic uint64_t ts;
};
struct CUmod_st { uint32_t magic; };
struct CUfunc_st { uint32_t magic; char name[64]; };
struct CUmemPoolHandle_st { uint32_t magic; int dev; };
struct CUarray_st { uint32_t magic; int dev; uint64_t size; };
struct CUmipmappedArray_st { uint32_t magic; int dev; uint64_t size; };
#define GRAPH_MAX 256
struct CUgraph_st { uint32_t magic; int n; uint64_t dur[GRAPH_MAX]; };
struct CUgraphExec_st { uint32_t magic; int n; uint64_t dur[GRAPH_MAX]; };

/* ------------------------------------------------------------------ call counts */
enum { C_LAUNCH, C_EV_CREATE, C_EV_RECORD, C_EV_QUERY, C_EV_SYNC, C_EV_ELAPSED, C_N };
static const char *const g_call_names[C_N] = {"launch", "cuEventCreate", "cuEventRecord", "cuEventQuery",
                                               "cuEventSynchronize", "cuEventElapsedTime"};
static _Atomic unsigned long long g_calls[C_N];
#define COUNT(c) atomic_fetch_add_explicit(&g_calls[c], 1, memory_order_relaxed)

__attribute__((destructor)) static void write_call_counts(void) {
    const char *path = getenv("FAKECUDA_CALLS");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    for (int i = 0; i < C_N; i++) fprintf(f, "%d %s %llu\n", (int)getpid(), g_call_names[i], atomic_load(&g_calls[i]));
    fclose(f);
}

enum { OP_KERNEL = 1, OP_EVENT = 2 };
struct op { int kind; uint64_t dur; struct CUevent_st *ev; uint64_t seq; uint64_t enq_ns; };
struct pend { uint64_t seq; uint64_t end; struct CUevent_st *ev; };

struct devq {
    pthread_mutex_t m;
    pthread_cond_t cv_work, cv_done;
    struct op ring[QCAP];
    uint64_t head;      /* next sequence number to enqueue */
    uint64_t taken;     /* next sequence number the worker takes */
    uint64_t completed; /* every op with seq < completed is done */
    struct pend pending[QCAP];
    int npend;
    uint64_t last_end;
    int started;
    pthread_t th;
};

static struct fg_state *S;
static int g_inited;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct devq Q[FG_MAX_DEV];
static struct CUctx_st g_primary[FG_MAX_DEV];
static struct CUstream_st g_legacy[FG_MAX_DEV];
static __thread struct CUctx_st *t_ctx;
static __thread struct CUctx_st *t_ctx_stack[16];
static __thread int t_ctx_depth;
static __thread struct CUstream_st t_ptsz[FG_MAX_DEV];
static _Atomic uint64_t g_next_ptr[FG_MAX_DEV];
static _Atomic uint64_t g_next_handle = 0x1000;
static uint64_t g_last_sweep;

/* ---------------------------------------------------------------- allocations */
enum { A_MEM = 1, A_HANDLE = 2 };
struct alloc { uint64_t key; uint64_t size; int dev; int kind; struct alloc *next; };
#define ABUCKETS 4096
static struct alloc *g_allocs[ABUCKETS];
static pthread_mutex_t g_alloc_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned hkey(uint64_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 52) % ABUCKETS; }

static void alloc_put(uint64_t key, uint64_t size, int dev, int kind) {
    struct alloc *a = malloc(sizeof *a);
    a->key = key; a->size = size; a->dev = dev; a->kind = kind;
    pthread_mutex_lock(&g_alloc_lock);
    a->next = g_allocs[hkey(key)];
    g_allocs[hkey(key)] = a;
    pthread_mutex_unlock(&g_alloc_lock);
}

static int alloc_take(uint64_t key, int kind, uint64_t *size, int *dev) {
    pthread_mutex_lock(&g_alloc_lock);
    struct alloc **pp = &g_allocs[hkey(key)];
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->key == key && (*pp)->kind == kind) {
            struct alloc *a = *pp;
            *pp = a->next;
            pthread_mutex_unlock(&g_alloc_lock);
            *size = a->size; *dev = a->dev;
            free(a);
            return 1;
        }
    }
    pthread_mutex_unlock(&g_alloc_lock);
    return 0;
}

/* The device's count and the process's entry move together, under the state's lock: a process
 * SIGKILLed between two separate updates left them apart for good, and its entry, freed again by
 * the sweep, took the device's count below zero (an unsigned wrap: every later allocation and
 * context on the fake GPU was refused, as if the card were full). The real driver frees exactly
 * what a dead process held. */
static int mem_reserve(int dev, uint64_t size) {
    struct fg_dev *d = &S->dev[dev];
    int pi = fg_proc_index(); /* before the lock: registering takes it */
    for (int attempt = 0; attempt < 2; attempt++) {
        fg_lock(S);
        uint64_t cur = atomic_load(&d->used_mem);
        int ok = cur + size <= d->total_mem;
        if (ok) {
            atomic_store(&d->used_mem, cur + size);
            if (pi >= 0) atomic_fetch_add(&S->procs[pi].mem[dev], size);
        }
        fg_unlock(S);
        if (ok) return 1;
        if (attempt == 0) fg_sweep_dead(S);
    }
    atomic_fetch_add(&d->ooms, 1);
    return 0;
}

static void mem_unreserve(int dev, uint64_t size) {
    int pi = fg_proc_index();
    fg_lock(S);
    atomic_fetch_sub(&S->dev[dev].used_mem, size);
    if (pi >= 0) atomic_fetch_sub(&S->procs[pi].mem[dev], size);
    fg_unlock(S);
}

static uint64_t new_dptr(int dev, uint64_t size) {
    uint64_t step = (size + 511) & ~511ull;
    return atomic_fetch_add(&g_next_ptr[dev], step ? step : 512);
}

/* ---------------------------------------------------------------- execution queues */
static void log_kernel(int dev, uint64_t s, uint64_t e) {
    uint64_t idx = atomic_fetch_add(&S->log_head, 1);
    struct fg_log *l = &S->log[idx % FG_LOG_ENTRIES];
    atomic_store_explicit(&l->seq, 0, memory_order_relaxed);
    l->start_ns = s;
    l->end_ns = e;
    l->pid = (int32_t)getpid();
    l->dev = dev;
    atomic_store_explicit(&l->seq, idx + 1, memory_order_release);
}

static uint64_t reserve_timeline(int dev, uint64_t dur, uint64_t now) {
    struct fg_dev *d = &S->dev[dev];
    uint64_t f = atomic_load(&d->free_at_ns);
    uint64_t s;
    do {
        s = f > now ? f : now;
    } while (!atomic_compare_exchange_weak(&d->free_at_ns, &f, s + dur));
    atomic_fetch_add(&d->busy_ns, dur);
    atomic_fetch_add(&d->kernels, 1);
    int pi = fg_proc_index();
    if (pi >= 0) {
        atomic_fetch_add(&S->procs[pi].busy_ns[dev], dur);
        atomic_fetch_add(&S->procs[pi].kernels, 1);
    }
    log_kernel(dev, s, s + dur);
    return s + dur;
}

static void abs_deadline(struct timespec *ts, uint64_t ns) {
    ts->tv_sec = (time_t)(ns / 1000000000ull);
    ts->tv_nsec = (long)(ns % 1000000000ull);
}

static void *worker(void *arg) {
    int dev = (int)(intptr_t)arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* a GPU finishes kernels on time */
    struct devq *q = &Q[dev];
    pthread_mutex_lock(&q->m);
    for (;;) {
        while (q->taken == q->head && q->npend == 0) pthread_cond_wait(&q->cv_work, &q->m);
        uint64_t now = fg_now_ns();
        while (q->taken < q->head && q->npend < QCAP) {
            if (q->npend > 0 && q->last_end > now + LOOKAHEAD_NS) break;
            struct op *o = &q->ring[q->taken % QCAP];
            struct pend p = {o->seq, 0, o->ev};
            if (o->kind == OP_KERNEL) {
                /* A GPU starts submitted work as soon as it is free: at the launch time, not
                 * when this worker thread gets a CPU (its delays must not look like GPU time). */
                uint64_t start_floor = q->last_end > o->enq_ns ? q->last_end : o->enq_ns;
                p.end = reserve_timeline(dev, o->dur, start_floor);
                q->last_end = p.end;
            } else {
                p.end = o->enq_ns > q->last_end ? o->enq_ns : q->last_end;
                atomic_store(&o->ev->ts, p.end);
            }
            q->pending[q->npend++] = p;
            q->taken++;
        }
        now = fg_now_ns();
        int done = 0;
        while (done < q->npend && q->pending[done].end <= now) done++;
        if (done) {
            q->completed = q->pending[done - 1].seq + 1;
            memmove(q->pending, q->pending + done, (size_t)(q->npend - done) * sizeof(struct pend));
            q->npend -= done;
            pthread_cond_broadcast(&q->cv_done);
        }
        if (q->npend > 0) {
            uint64_t wake = q->pending[0].end;
            if (q->taken < q->head && q->last_end > LOOKAHEAD_NS && q->last_end - LOOKAHEAD_NS < wake)
                wake = q->last_end - LOOKAHEAD_NS;
            if (wake > now) {
                struct timespec ts;
                abs_deadline(&ts, wake);
                pthread_cond_timedwait(&q->cv_work, &q->m, &ts);
            }
        }
    }
    return NULL;
}

static void q_init(int dev) {
    struct devq *q = &Q[dev];
    pthread_mutex_init(&q->m, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv_work, &ca);
    pthread_cond_init(&q->cv_done, &ca);
    pthread_condattr_destroy(&ca);
}

/* Enqueue ops; returns the sequence number of the last one. */
static int g_instant = -1;

/* FAKECUDA_INSTANT=1 (benchmarks): work of zero duration submitted to an idle queue completes
 * at once, without the worker thread, so the driver's own cost of a launch stays small and
 * steady and the limiter's cost can be told apart from it. */
static int instant_done(struct devq *q, int kind, const uint64_t *durs, int n, struct CUevent_st *ev, uint64_t *seq) {
    if (g_instant < 0) {
        const char *v = getenv("FAKECUDA_INSTANT");
        g_instant = v && *v == '1';
    }
    if (!g_instant || n != 1 || (durs && durs[0]) || q->taken != q->head || q->npend) return 0;
    *seq = q->head++;
    q->taken = q->head;
    q->completed = q->head;
    if (ev) {
        ev->seq = *seq;
        ev->recorded = 1;
        uint64_t now = fg_now_ns();
        atomic_store(&ev->ts, now > q->last_end ? now : q->last_end);
    } else if (kind == OP_KERNEL) {
        int pi = fg_proc_index();
        if (pi >= 0) atomic_fetch_add(&S->procs[pi].kernels, 1);
    }
    return 1;
}

static uint64_t enqueue(int dev, int kind, const uint64_t *durs, int n, struct CUevent_st *ev) {
    struct devq *q = &Q[dev];
    pthread_mutex_lock(&q->m);
    uint64_t iseq;
    if (instant_done(q, kind, durs, n, ev, &iseq)) {
        pthread_mutex_unlock(&q->m);
        return iseq;
    }
    if (!q->started) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_create(&q->th, &at, worker, (void *)(intptr_t)dev);
        pthread_attr_destroy(&at);
        q->started = 1;
    }
    uint64_t seq = 0;
    for (int i = 0; i < n; i++) {
        while (q->head - q->completed >= QCAP) pthread_cond_wait(&q->cv_done, &q->m);
        seq = q->head++;
        struct op *o = &q->ring[seq % QCAP];
        o->kind = kind;
        o->dur = durs ? durs[i] : 0;
        o->ev = ev;
        o->seq = seq;
        o->enq_ns = fg_now_ns();
        if (ev) {
            ev->seq = seq;
            ev->recorded = 1;
        }
    }
    pthread_cond_signal(&q->cv_work);
    pthread_mutex_unlock(&q->m);
    return seq;
}

static void wait_seq(int dev, uint64_t seq) {
    struct devq *q = &Q[dev];
    pthread_mutex_lock(&q->m);
    while (q->completed <= seq) pthread_cond_wait(&q->cv_done, &q->m);
    pthread_mutex_unlock(&q->m);
}

static int seq_done(int dev, uint64_t seq) {
    struct devq *q = &Q[dev];
    pthread_mutex_lock(&q->m);
    int r = q->completed > seq;
    pthread_mutex_unlock(&q->m);
    return r;
}

/* ---------------------------------------------------------------- helpers */
#define CHECK_INIT() do { if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define CHECK_CTX() do { CHECK_INIT(); if (!t_ctx) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

static int valid_dev(CUdevice d) { return S && d >= 0 && (unsigned)d < S->ndev; }

/* Resolve a stream handle to its queue state and device. */
static CUresult resolve_stream(CUstream s, int ptsz, struct CUstream_st **out, int *dev) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        if (!t_ctx) return CUDA_ERROR_INVALID_CONTEXT;
        int d = t_ctx->dev;
        int per_thread = (s == CU_STREAM_PER_THREAD) || (s == NULL && ptsz);
        *out = per_thread ? &t_ptsz[d] : &g_legacy[d];
        *dev = d;
        return CUDA_SUCCESS;
    }
    if (s->magic != M_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    *dev = s->ctx->dev;
    return CUDA_SUCCESS;
}

static uint64_t kernel_duration(void **params) {
    if (!params || !params[0]) return 0;
    uint64_t v;
    memcpy(&v, params[0], sizeof v);
    return v;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream hs, void **params, int ptsz) {
    COUNT(C_LAUNCH);
    CHECK_CTX();
    if (!f || f->magic != M_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    uint64_t dur = kernel_duration(params);
    st->last_seq = enqueue(dev, OP_KERNEL, &dur, 1, NULL);
    st->used = 1;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- init, devices, contexts */
EXPORT CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (!g_inited) {
        S = fg_attach();
        if (!S || fg_proc_index() < 0) {
            pthread_mutex_unlock(&g_lock);
            return CUDA_ERROR_NO_DEVICE;
        }
        for (int d = 0; d < FG_MAX_DEV; d++) {
            q_init(d);
            g_primary[d].magic = M_CTX;
            g_primary[d].dev = d;
            g_primary[d].primary = 1;
            g_legacy[d].magic = M_STREAM;
            g_legacy[d].ctx = &g_primary[d];
            g_next_ptr[d] = 0x200000000ull + ((uint64_t)d << 40);
        }
        g_inited = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    CHECK_INIT();
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = (int)S->ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    CHECK_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    CHECK_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", S->dev[d].name);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    CHECK_INIT();
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    memcpy(u->bytes, S->dev[d].uuid, 16);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    CHECK_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = S->dev[d].total_mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d) {
    CHECK_INIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case 16: *v = 132; break;  /* MULTIPROCESSOR_COUNT */
    case 75: *v = 9; break;    /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; break;    /* COMPUTE_CAPABILITY_MINOR */
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

/* A context takes device memory (the device's ctx_bytes) while it exists: the primary context
 * from its first retain until its last release (or a reset), each created context until it is
 * destroyed; without the memory, creating it fails with CUDA_ERROR_OUT_OF_MEMORY, as on a full
 * GPU.  A dead process's contexts are returned with the rest of its memory. */
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_ctx(int dev, int delta) {
    int pi = fg_proc_index();
    if (pi >= 0) atomic_fetch_add(&S->procs[pi].ctxs[dev], (uint32_t)delta);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    CHECK_INIT();
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_lock);
    if (g_primary[d].refs == 0 && !mem_reserve(d, S->dev[d].ctx_bytes)) {
        pthread_mutex_unlock(&g_primary_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (g_primary[d].refs++ == 0) count_ctx(d, 1);
    pthread_mutex_unlock(&g_primary_lock);
    *c = &g_primary[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    CHECK_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_lock);
    if (g_primary[d].refs <= 0) {
        pthread_mutex_unlock(&g_primary_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (--g_primary[d].refs == 0) {
        mem_unreserve(d, S->dev[d].ctx_bytes);
        count_ctx(d, -1);
    }
    pthread_mutex_unlock(&g_primary_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    CHECK_INIT();
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_lock);
    if (g_primary[d].refs > 0) {
        mem_unreserve(d, S->dev[d].ctx_bytes);
        count_ctx(d, -1);
    }
    g_primary[d].refs = 0;
    pthread_mutex_unlock(&g_primary_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    CHECK_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_primary_lock);
    *flags = 0;
    *active = g_primary[d].refs > 0;
    pthread_mutex_unlock(&g_primary_lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags;
    CHECK_INIT();
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (!mem_reserve(d, S->dev[d].ctx_bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    count_ctx(d, 1);
    struct CUctx_st *x = calloc(1, sizeof *x);
    x->magic = M_CTX;
    x->dev = d;
    if (t_ctx && t_ctx_depth < 16) t_ctx_stack[t_ctx_depth++] = t_ctx;
    t_ctx = x;
    *c = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    CHECK_INIT();
    if (!c || c->magic != M_CTX || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (Q[c->dev].head) wait_seq(c->dev, Q[c->dev].head - 1); /* its work done (none: nothing to wait for) */
    if (t_ctx == c) t_ctx = t_ctx_depth ? t_ctx_stack[--t_ctx_depth] : NULL;
    c->magic = 0;
    mem_unreserve(c->dev, S->dev[c->dev].ctx_bytes);
    count_ctx(c->dev, -1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    CHECK_INIT();
    if (c && c->magic != M_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    CHECK_INIT();
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = t_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    CHECK_INIT();
    if (!c || c->magic != M_CTX) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx_depth >= 16) return CUDA_ERROR_INVALID_VALUE;
    t_ctx_stack[t_ctx_depth++] = t_ctx;
    t_ctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    CHECK_CTX();
    if (c) *c = t_ctx;
    t_ctx = t_ctx_depth ? t_ctx_stack[--t_ctx_depth] : NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    CHECK_CTX();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = t_ctx->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    CHECK_CTX();
    struct devq *q = &Q[t_ctx->dev];
    pthread_mutex_lock(&q->m);
    uint64_t last = q->head;
    while (q->completed < last) pthread_cond_wait(&q->cv_done, &q->m);
    pthread_mutex_unlock(&q->m);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- memory */
EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    CHECK_CTX();
    if (!free_b || !total_b) return CUDA_ERROR_INVALID_VALUE;
    uint64_t now = fg_now_ns();
    if (now - g_last_sweep > 50000000ull) {
        g_last_sweep = now;
        fg_sweep_dead(S);
    }
    struct fg_dev *d = &S->dev[t_ctx->dev];
    uint64_t used = atomic_load(&d->used_mem);
    *total_b = d->total_mem;
    *free_b = used > d->total_mem ? 0 : d->total_mem - used;
    return CUDA_SUCCESS;
}

static CUresult mem_alloc_on(int dev, CUdeviceptr *p, size_t size) {
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!mem_reserve(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = new_dptr(dev, size);
    alloc_put(*p, size, dev, A_MEM);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    CHECK_CTX();
    return mem_alloc_on(t_ctx->dev, p, size);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
    CHECK_CTX();
    if (flags != 1 && flags != 2) return CUDA_ERROR_INVALID_VALUE;
    return mem_alloc_on(t_ctx->dev, p, size);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned elem) {
    CHECK_CTX();
    if (!pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + 511) & ~(size_t)511;
    CUresult r = mem_alloc_on(t_ctx->dev, p, pt * height);
    if (r == CUDA_SUCCESS) *pitch = pt;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    CHECK_CTX();
    if (p == 0) return CUDA_SUCCESS;
    uint64_t size;
    int dev;
    if (!alloc_take(p, A_MEM, &size, &dev)) return CUDA_ERROR_INVALID_VALUE;
    mem_unreserve(dev, size);
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream hs, int ptsz) {
    CHECK_CTX();
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    if (pool) {
        if (pool->magic != M_POOL) return CUDA_ERROR_INVALID_VALUE;
        dev = pool->dev;
    }
    return mem_alloc_on(dev, p, size);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) { return alloc_async(p, size, NULL, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) { return alloc_async(p, size, NULL, s, 1); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, pool, s, 0);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, pool, s, 1);
}

static CUresult free_async(CUdeviceptr p, CUstream hs, int ptsz) {
    CHECK_CTX();
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    return cuMemFree_v2(p);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(p, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(p, s, 1); }

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    CHECK_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    static struct CUmemPoolHandle_st defaults[FG_MAX_DEV];
    defaults[d].magic = M_POOL;
    defaults[d].dev = d;
    *pool = &defaults[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CHECK_INIT();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    p->magic = M_POOL;
    p->dev = props->location.id;
    *pool = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CHECK_INIT();
    if (!pool || pool->magic != M_POOL) return CUDA_ERROR_INVALID_VALUE;
    pool->magic = 0;
    return CUDA_SUCCESS;
}

#define GRANULARITY (2ull << 20)
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    (void)option;
    CHECK_INIT();
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    CHECK_INIT();
    if (!h || !prop || flags || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    uint64_t key = atomic_fetch_add(&g_next_handle, 1);
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!valid_dev(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        if (!mem_reserve(prop->location.id, size)) return CUDA_ERROR_OUT_OF_MEMORY;
        alloc_put(key, size, prop->location.id, A_HANDLE);
    } else if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST ||
               prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
        alloc_put(key, 0, -1, A_HANDLE);
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *h = key;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    CHECK_INIT();
    uint64_t size;
    int dev;
    if (!alloc_take(h, A_HANDLE, &size, &dev)) return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0) mem_unreserve(dev, size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    CHECK_INIT();
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    *p = new_dptr(FG_MAX_DEV - 1, size) + (1ull << 46);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; CHECK_INIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    (void)p; (void)size; (void)off; (void)h; (void)flags;
    CHECK_INIT();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) { (void)p; (void)size; CHECK_INIT(); return CUDA_SUCCESS; }
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n) {
    (void)p; (void)size; (void)d; (void)n;
    CHECK_INIT();
    return CUDA_SUCCESS;
}

static uint64_t format_bytes(int fmt) {
    switch (fmt) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch) {
    uint64_t e = format_bytes(fmt);
    if (!e || !w || (ch != 1 && ch != 2 && ch != 4)) return 0;
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * e * ch;
}

static CUresult array_create(CUarray *a, uint64_t size) {
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    if (!mem_reserve(t_ctx->dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUarray_st *x = calloc(1, sizeof *x);
    x->magic = M_ARRAY;
    x->dev = t_ctx->dev;
    x->size = size;
    *a = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    CHECK_CTX();
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    return array_create(a, array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels));
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    CHECK_CTX();
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    return array_create(a, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}

EXPORT CUresult cuArrayDestroy(CUarray a) {
    CHECK_INIT();
    if (!a || a->magic != M_ARRAY) return CUDA_ERROR_INVALID_HANDLE;
    mem_unreserve(a->dev, a->size);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    CHECK_CTX();
    if (!m || !d || !levels) return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    int layered = (d->Flags & CUDA_ARRAY3D_LAYERED) != 0;
    for (unsigned l = 0; l < levels; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = layered ? d->Depth : d->Depth >> l;
        if (!w) w = 1;
        if (d->Height && !h) h = 1;
        if (d->Depth && !z) z = 1;
        uint64_t b = array_bytes(w, h, z, d->Format, d->NumChannels);
        if (!b) return CUDA_ERROR_INVALID_VALUE;
        total += b;
    }
    if (!mem_reserve(t_ctx->dev, total)) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUmipmappedArray_st *x = calloc(1, sizeof *x);
    x->magic = M_MIPMAP;
    x->dev = t_ctx->dev;
    x->size = total;
    *m = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    CHECK_INIT();
    if (!m || m->magic != M_MIPMAP) return CUDA_ERROR_INVALID_HANDLE;
    mem_unreserve(m->dev, m->size);
    m->magic = 0;
    free(m);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- modules and launches */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    CHECK_CTX();
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *x = calloc(1, sizeof *x);
    x->magic = M_MOD;
    *m = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
    CHECK_INIT();
    if (!m || m->magic != M_MOD) return CUDA_ERROR_INVALID_HANDLE;
    m->magic = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    CHECK_CTX();
    if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m || m->magic != M_MOD) return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *x = calloc(1, sizeof *x);
    x->magic = M_FUNC;
    snprintf(x->name, sizeof x->name, "%s", name);
    *f = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned smem, CUstream s, void **params, void **extra) {
    (void)smem; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, 0);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,
                                    void **extra) {
    (void)smem; (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, 1);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned smem, CUstream s, void **params) {
    (void)smem;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, 0);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned smem, CUstream s,
                                               void **params) {
    (void)smem;
    return launch(f, gx, gy, gz, bx, by, bz, s, params, 1);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  c->hStream, params, 0);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  c->hStream, params, 1);
}

/* ---------------------------------------------------------------- graphs */
EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
    CHECK_INIT();
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *x = calloc(1, sizeof *x);
    x->magic = M_GRAPH;
    *g = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    (void)deps; (void)ndeps;
    CHECK_INIT();
    if (!node || !p || !g || g->magic != M_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    if (!p->func || p->func->magic != M_FUNC) return CUDA_ERROR_INVALID_HANDLE;
    if (g->n >= GRAPH_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    g->dur[g->n++] = kernel_duration(p->kernelParams);
    *node = (CUgraphNode)(uintptr_t)g->n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)flags;
    CHECK_CTX();
    if (!e || !g || g->magic != M_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    x->magic = M_EXEC;
    x->n = g->n;
    memcpy(x->dur, g->dur, sizeof x->dur);
    *e = x;
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec e, CUstream hs, int ptsz) {
    COUNT(C_LAUNCH);
    CHECK_CTX();
    if (!e || e->magic != M_EXEC) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    if (e->n) st->last_seq = enqueue(dev, OP_KERNEL, e->dur, e->n, NULL);
    st->used = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s, 0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s, 1); }

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
    CHECK_INIT();
    if (!e || e->magic != M_EXEC) return CUDA_ERROR_INVALID_VALUE;
    e->magic = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph g) {
    CHECK_INIT();
    if (!g || g->magic != M_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    g->magic = 0;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- streams and events */
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    CHECK_CTX();
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *x = calloc(1, sizeof *x);
    x->magic = M_STREAM;
    x->ctx = t_ctx;
    *s = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    CHECK_INIT();
    if (!s || s->magic != M_STREAM) return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream hs, int ptsz) {
    CHECK_CTX();
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    if (st->used) wait_seq(dev, st->last_seq);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }

static CUresult stream_query(CUstream hs, int ptsz) {
    CHECK_CTX();
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    return (!st->used || seq_done(dev, st->last_seq)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamQuery(CUstream s) { return stream_query(s, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, 1); }

EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
    COUNT(C_EV_CREATE);
    CHECK_CTX();
    if (!e || flags & ~3u) return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *x = calloc(1, sizeof *x);
    x->magic = M_EVENT;
    x->flags = flags;
    x->dev = t_ctx->dev;
    *e = x;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    CHECK_INIT();
    if (!e || e->magic != M_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded) wait_seq(e->dev, e->seq); /* the worker may still reference it */
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream hs, int ptsz) {
    COUNT(C_EV_RECORD);
    CHECK_CTX();
    if (!e || e->magic != M_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st;
    int dev;
    CUresult r = resolve_stream(hs, ptsz, &st, &dev);
    if (r) return r;
    if (dev != e->dev) return CUDA_ERROR_INVALID_HANDLE;
    st->last_seq = enqueue(dev, OP_EVENT, NULL, 1, e);
    st->used = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

EXPORT CUresult cuEventQuery(CUevent e) {
    COUNT(C_EV_QUERY);
    CHECK_INIT();
    if (!e || e->magic != M_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (!e->recorded) return CUDA_SUCCESS;
    return seq_done(e->dev, e->seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    COUNT(C_EV_SYNC);
    CHECK_INIT();
    if (!e || e->magic != M_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded) wait_seq(e->dev, e->seq);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    COUNT(C_EV_ELAPSED);
    CHECK_INIT();
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != M_EVENT || b->magic != M_EVENT) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (!seq_done(a->dev, a->seq) || !seq_done(b->dev, b->seq)) return CUDA_ERROR_NOT_READY;
    double d = ((double)atomic_load(&b->ts) - (double)atomic_load(&a->ts)) / 1e6;
    *ms = (float)d;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- errors */
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) { return cuGetErrorName(r, s); }

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)id;
    if (table) *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------- cuGetProcAddress */
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

struct procent { const char *name; int ver; void *fn; void *ptsz; };
#define P(n, v, f) {n, v, (void *)f, NULL}
#define PZ(n, v, f) {n, v, (void *)f, (void *)f##_ptsz}
static const struct procent g_procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    PZ("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PZ("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PZ("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    P("cuModuleLoadData", 2000, cuModuleLoadData),
    P("cuModuleUnload", 2000, cuModuleUnload),
    P("cuModuleGetFunction", 2000, cuModuleGetFunction),
    PZ("cuLaunchKernel", 4000, cuLaunchKernel),
    PZ("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    PZ("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    PZ("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    PZ("cuStreamSynchronize", 2000, cuStreamSynchronize),
    PZ("cuStreamQuery", 2000, cuStreamQuery),
    P("cuEventCreate", 2000, cuEventCreate),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    PZ("cuEventRecord", 2000, cuEventRecord),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetExportTable", 3000, cuGetExportTable),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult proc_lookup(const char *sym, void **pfn, int ver, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    const struct procent *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        if (strcmp(g_procs[i].name, sym) != 0) continue;
        known = 1;
        if (g_procs[i].ver <= ver && (!best || g_procs[i].ver > best->ver)) best = &g_procs[i];
    }
    *pfn = NULL;
    if (!best) {
        if (status) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz) ? best->ptsz : best->fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return proc_lookup(sym, pfn, ver, flags, NULL);
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    return proc_lookup(sym, pfn, ver, flags, status);
}
