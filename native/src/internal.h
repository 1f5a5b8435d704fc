/* Internal interfaces of libgpuops-limiter.so. */
#ifndef GPUOPS_INTERNAL_H
#define GPUOPS_INTERNAL_H

#include "gpuops_cuda.h"
#include "region.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define GL_EXPORT __attribute__((visibility("default")))
#define GL_MAX_DEV 64
#define GL_LIKELY(x) __builtin_expect(!!(x), 1)
#define GL_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ------------------------------------------------------------------ logging (util.c) */
enum { LOG_NONE = 0, LOG_ERROR = 1, LOG_WARN = 2, LOG_INFO = 3, LOG_DEBUG = 4 };
struct gl_ratelimit {
    _Atomic uint64_t window;
    _Atomic uint32_t count;
    _Atomic uint32_t dropped;
};
extern int gl_log_level;
void gl_log_init(void);
void gl_log_impl(int level, struct gl_ratelimit *rl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Rate-limited per call site: at most 5 lines per 10 s each. */
#define GL_LOG(level, ...)                                              \
    do {                                                                \
        if ((level) <= gl_log_level) {                                  \
            static struct gl_ratelimit _rl;                             \
            gl_log_impl((level), &_rl, __VA_ARGS__);                    \
        }                                                               \
    } while (0)

static inline uint64_t gl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* CLOCK_MONOTONIC_COARSE: a few ns, resolution of the kernel tick (1-4 ms) */
static inline uint64_t gl_coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
uint64_t gl_thread_cpu_ns(void);
uint64_t gl_proc_starttime(int pid);
uint64_t gl_pidns(void);
int gl_parse_bytes(const char *s, uint64_t *out);
int gl_parse_percent(const char *s, double *out);

/* ------------------------------------------------------------------ configuration (config.c) */
/* No memory cap.  A cap of 0 is a real cap: every allocation is refused. */
#define GL_MEM_NONE UINT64_MAX

struct gl_cfg {
    int policy;               /* POLICY_* (first: read on every launch, see struct gl_dev) */
    int klass;                /* CLASS_* */
    uint32_t share_permille;  /* 0 = none */
    uint64_t mem_limit;       /* bytes, GL_MEM_NONE = none */
};

struct gl_table_entry {
    char name[RG_NAME_LEN];
    char gpus[256];           /* "" = every GPU, else comma list of indices and UUIDs */
    struct gl_cfg cfg;
};

struct gl_table {
    uint64_t generation;
    int n;
    struct gl_table_entry *e;
};

/* Parse a tenant table; returns 0 and fills *out, or -1 with a message in err. */
int gl_table_parse(const char *text, size_t len, struct gl_table *out, char *err, size_t errlen);
void gl_table_free(struct gl_table *t);
/* The entry for tenant on GPU (index, uuid), else the "tenant *" entry: 1 if found; 0 if no line
 * of the table applies to the GPU (it is not under the limiter); -1 if some line applies to the
 * GPU but none for this tenant and no "tenant *" (the caller fails closed). */
int gl_table_lookup(const struct gl_table *t, const char *tenant, int index, const char *uuid, struct gl_cfg *out);
/* The most restrictive configuration: what a process gets when the node is managed but there is
 * no valid table to say what it may have (memory cap 0, fixed 1% share, offline). */
struct gl_cfg gl_cfg_closed(void);

struct gl_env {
    uint64_t mem_limit_all, mem_limit_dev[GL_MAX_DEV];
    double share_all, share_dev[GL_MAX_DEV];   /* percent, <0 = unset */
    int policy;                                /* -1 unset */
    int klass;                                 /* -1 unset */
};
void gl_env_read(struct gl_env *env);
/* The table's configuration lowered by the environment. */
struct gl_cfg gl_cfg_lower(const struct gl_cfg *table, int table_found, const struct gl_env *env, int dev);

/* ------------------------------------------------------------------ process state (hooks.c) */
struct gl_meas_stream {
    /* what a launch reads, in one cache line */
    CUstream s;
    int ptsz;
    int tid;                  /* for the per-thread default stream */
    int open;
    int head, n;
    uint32_t since;           /* launches since the last end event */
    CUevent prev;             /* start of the unmeasured part */
#define GL_RING 32
    CUevent ring[GL_RING];
    uint32_t ring_cnt[GL_RING];
    uint64_t ring_ts[GL_RING]; /* when each end event was recorded */
};

struct gl_dev {
    /* Read on every launch, in the first cache line: a real driver's launch (~3.5 us on an
     * H100) leaves little of the caller's data in cache, and the limiter's launch path cost
     * ~100 ns there against ~35 ns on the fake driver while these were spread over six lines. */
    _Alignas(64) _Atomic int state; /* 0 not set up, 1 ready, 2 region unavailable (local accounting) */
    _Atomic int sched_off;    /* compute gating given up (region lock stuck) */
    _Atomic int mlock;
    int tidx;
    int nms;
    struct rg_region *rg;
    uint64_t launches;
    uint64_t local_seq;
    double avg_cost_ns;
    struct gl_cfg cfg;        /* effective configuration (policy at offset 56) */
    /* the rest */
    int index;
    char uuid[RG_UUID_LEN];
    int fd;
    int slot;
    struct rg_slot *me;
    struct rg_tenant *tn;
    uint64_t cfg_gen;
    _Atomic uint64_t local_used;
    struct gl_meas_stream ms[8];
    CUevent pool[80];
    int npool;
    uint64_t inflight_est_ns;
    uint64_t wait_since;
    /* contexts of this process on the GPU and the memory charged for them (context.c) */
    pthread_mutex_t ctx_mutex;  /* zero-initialised = PTHREAD_MUTEX_INITIALIZER */
    int primary_on;           /* the primary context is charged */
    uint64_t primary_bytes;   /* what it was charged */
    _Atomic int ctx_seen;     /* some context of this process on the GPU was charged (or is being made) */
};
_Static_assert(offsetof(struct gl_dev, cfg) + offsetof(struct gl_cfg, policy) < 64,
               "the fields a launch reads share the first cache line");

struct gl_state {
    pthread_mutex_t lock;
    int ready;
    int ndev;
    char tenant[RG_NAME_LEN];
    char dir[512];
    struct gl_env env;
    struct gl_table table;
    int table_ok;             /* G.table holds the tenant table or the last good copy of it */
    int mandatory;            /* /run/gpuops/limiter/mandatory exists: a table must be there */
    int fail_closed;          /* no valid table on a managed node: gl_cfg_closed() for everyone */
    int identity_broken;      /* /etc/gpuops/tenant is there but names no tenant: gl_cfg_closed() */
    uint64_t table_epoch;     /* bumped whenever table_ok, table or fail_closed change */
    uint64_t table_mtime_ns, table_size, table_ino;
    _Atomic uint64_t next_reload_check;
    uint64_t init_wall_ns, init_cpu_ns;  /* cost of gl_init, reported with the first registration */
    int init_reported;
    struct gl_dev dev[GL_MAX_DEV];
};
extern struct gl_state G;

/* Real driver entry points, resolved from dlopen("libcuda.so.1"). */
struct gl_real {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventDestroy_v2)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventRecord_ptsz)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
};
extern struct gl_real R;

int gl_init(void);                        /* resolves the driver; 0 on success */
struct gl_dev *gl_dev_current(void);      /* device of the current context, set up; NULL if none */
struct gl_dev *gl_dev_get(int index);     /* set up device index */
void gl_maybe_reload(void);               /* re-read the tenant table if it changed (rate-limited) */
void *gl_dlsym(void *handle, const char *name); /* the real dlsym (not the exported wrapper) */

/* ------------------------------------------------------------------ region (region.c) */
int gl_region_attach(struct gl_dev *d);   /* open/create, register; 0 on success */
int gl_region_valid(const struct rg_region *rg);
uint64_t gl_tenant_mem_used(struct gl_dev *d);
int gl_reclaim_dead(struct gl_dev *d, int tenant_only); /* returns slots reclaimed */
void gl_publish_cfg(struct gl_dev *d);
int gl_lock_region(struct rg_region *rg, int try_only);
void gl_unlock_region(struct rg_region *rg);
int gl_slot_alive(struct gl_dev *d, int i);

/* ------------------------------------------------------------------ memory (memory.c) */
int gl_mem_reserve(struct gl_dev *d, uint64_t size);
void gl_mem_unreserve(struct gl_dev *d, uint64_t size);
#define GL_TK_CTX 16 /* tracking kind of a context made by cuCtxCreate (memory.c's kinds are below) */
void gl_track_put(uint64_t key, int kind, int dev, uint64_t size);
int gl_track_take(uint64_t key, int kind, int *dev, uint64_t *size);
uint64_t gl_mem_limit(struct gl_dev *d);  /* effective limit, GL_MEM_NONE = none */

/* ------------------------------------------------------------------ contexts (context.c) */
/* What a context costs when it cannot be measured and the GPU's region has no measurement under
 * this driver: a PyTorch process on an H100 (driver 580.159.04, CUDA 13.0) held 518 MiB before
 * any allocation (docs/gpu-runs/2026-11-26b/memory-default.json). */
#define GL_CTX_DEFAULT_BYTES (518ull << 20)
/* A context of this process on d that no wrapper saw made (an entry point the limiter does not
 * wrap): charged once, at the first allocation, what a context costs there. */
void gl_ctx_unseen(struct gl_dev *d);

/* ------------------------------------------------------------------ compute (sched.c) */
/* Releases what this process holds in the scheduler when it exits. */
void gl_sched_fini(struct gl_dev *d);

#endif
