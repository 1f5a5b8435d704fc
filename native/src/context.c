/*
 * Contexts cost device memory, and a memory cap bounds the whole footprint of the tenant's
 * processes on the GPU: what they allocate, plus what the driver takes for each of their
 * contexts (docs/limiter.md, "What a cap bounds").
 *
 * A context's cost is measured where it is made (make_measured): NVML's figure for the process
 * once its first context on the GPU exists (what nvidia-smi shows for it), else the GPU's free
 * memory before and after the driver makes it, kept only if nothing else under the limiter moved
 * meanwhile.  Such measurements on a GPU are taken one at a time (an OFD byte lock in the region's
 * header, waited for at most 500 ms); a process that cannot have the lock makes its context
 * unmeasured and says so in the header before and after, so that a measurement it overlapped is
 * thrown away.  A measurement that is negative or more than the card is thrown away too.
 * Unmeasured, a context is charged the GPU's observed figure (the first measurement under this
 * driver, kept in the header), else GL_CTX_DEFAULT_BYTES.
 *
 * The charge goes through the same check as an allocation: a context that would take its tenant
 * over the cap is not made (CUDA_ERROR_OUT_OF_MEMORY, as a full GPU answers).  The expected cost
 * (the observed figure) is reserved before the driver is asked, the rest once measured; if the
 * rest does not fit, the context is released again.  Charges are given back when the context
 * goes (the primary context's last release or a reset; cuCtxDestroy), and with the process's slot
 * when it exits.
 */
#define _GNU_SOURCE
#include "hooklist.h"
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ NVML, loaded for the measure */
static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*count)(unsigned *);
    nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *); /* may be NULL */
    int ok;
} NV;
static pthread_once_t g_nv_once = PTHREAD_ONCE_INIT;
static nvmlDevice_t g_nv_dev[GL_MAX_DEV];
static int g_nv_found[GL_MAX_DEV]; /* 0 not looked up, 1 found, -1 not found */

static void nv_load(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        GL_LOG(LOG_INFO, "NVML not available (%s): contexts are charged the GPU's observed figure", dlerror());
        return;
    }
    *(void **)&NV.init = gl_dlsym(h, "nvmlInit_v2");
    *(void **)&NV.count = gl_dlsym(h, "nvmlDeviceGetCount_v2");
    *(void **)&NV.by_index = gl_dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&NV.uuid = gl_dlsym(h, "nvmlDeviceGetUUID");
    *(void **)&NV.mem = gl_dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&NV.procs = gl_dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!NV.procs) *(void **)&NV.procs = gl_dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
    NV.ok = NV.init && NV.count && NV.by_index && NV.uuid && NV.mem && NV.init() == NVML_SUCCESS;
    if (!NV.ok) GL_LOG(LOG_INFO, "NVML cannot be used: contexts are charged the GPU's observed figure");
}

/* The NVML handle of d's GPU (matched by UUID), or NULL. Called under d->ctx_mutex. */
static nvmlDevice_t nv_handle(struct gl_dev *d) {
    pthread_once(&g_nv_once, nv_load);
    if (!NV.ok) return NULL;
    int i = d->index;
    if (g_nv_found[i] == 0) {
        g_nv_found[i] = -1;
        unsigned n = 0;
        if (NV.count(&n) == NVML_SUCCESS) {
            for (unsigned k = 0; k < n && k < 1024; k++) {
                nvmlDevice_t h;
                char uuid[96];
                if (NV.by_index(k, &h) == NVML_SUCCESS && NV.uuid(h, uuid, sizeof uuid) == NVML_SUCCESS &&
                    !strcasecmp(uuid, d->uuid)) {
                    g_nv_dev[i] = h;
                    g_nv_found[i] = 1;
                    break;
                }
            }
        }
    }
    return g_nv_found[i] == 1 ? g_nv_dev[i] : NULL;
}

/* The GPU's free memory, device-wide (0 on failure). */
static int nv_free(struct gl_dev *d, uint64_t *out) {
    nvmlDevice_t h = nv_handle(d);
    nvmlMemory_t m;
    if (!h || NV.mem(h, &m) != NVML_SUCCESS) return 0;
    *out = m.free;
    return 1;
}

/* What NVML says this process holds on the GPU: 1 (listed, *out), 0 (not listed), -1 (cannot
 * tell: no NVML, an error, no figure).  NVML lists host pids: in a container with a pid namespace
 * of its own the process is not found under its pid (or another one is: the caller only trusts a
 * pid that appears with the context it makes). */
static int own_usage(struct gl_dev *d, uint64_t *out) {
    nvmlDevice_t h = nv_handle(d);
    if (!h || !NV.procs) return -1;
    nvmlProcessInfo_t small[64], *buf = small;
    unsigned room = 64, n = room;
    nvmlReturn_t r = NV.procs(h, &n, buf);
    for (int tries = 0; r == NVML_ERROR_INSUFFICIENT_SIZE && tries < 3 && n <= 65536; tries++) {
        if (buf != small) free(buf);
        room = n + 64; /* processes come meanwhile */
        buf = malloc(room * sizeof *buf);
        if (!buf) return -1;
        n = room;
        r = NV.procs(h, &n, buf);
    }
    int found = r == NVML_SUCCESS ? 0 : -1;
    unsigned me = (unsigned)getpid();
    for (unsigned k = 0; found == 0 && k < n && k < room; k++) {
        if (buf[k].pid != me) continue;
        if (buf[k].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ULL) {
            found = -1;
        } else {
            *out = buf[k].usedGpuMemory;
            found = 1;
        }
    }
    if (buf != small) free(buf);
    return found;
}

/* ------------------------------------------------------------------ figures */
static unsigned driver_version(void) {
    static _Atomic int v = -1;
    int x = atomic_load(&v);
    if (x < 0) {
        x = 0;
        if (R.cuDriverGetVersion && R.cuDriverGetVersion(&x) != CUDA_SUCCESS) x = 0;
        atomic_store(&v, x);
    }
    return (unsigned)x;
}

static struct rg_header *header(struct gl_dev *d) {
    return atomic_load_explicit(&d->state, memory_order_acquire) == 1 ? &d->rg->h : NULL;
}

/* The GPU's observed cost of a context under this driver (*have = 0: none observed). */
static uint64_t observed(struct gl_dev *d, int *have) {
    struct rg_header *h = header(d);
    *have = h && atomic_load(&h->ctx_measured) > 0 && atomic_load(&h->ctx_driver) == driver_version();
    return *have ? atomic_load(&h->ctx_bytes) : 0;
}

static uint64_t unmeasured_cost(struct gl_dev *d) {
    int have;
    uint64_t v = observed(d, &have);
    return have ? v : GL_CTX_DEFAULT_BYTES;
}

static uint64_t cuda_total(struct gl_dev *d, CUdevice dev) {
    size_t t = 0;
    if (!gl_real_cuDeviceTotalMem_v2 || gl_real_cuDeviceTotalMem_v2(&t, dev) != CUDA_SUCCESS) return 0;
    struct rg_header *h = header(d);
    if (h && atomic_load(&h->cuda_total) != t) atomic_store(&h->cuda_total, (uint64_t)t);
    return t;
}

/* What the limiter processes other than this one hold on the GPU, as counted in the region. */
static uint64_t others_used(struct gl_dev *d) {
    if (!header(d)) return 0;
    uint64_t sum = 0;
    for (int i = 0; i < RG_MAX_SLOTS; i++) {
        if (i == d->slot || (atomic_load(&d->rg->s[i].state) & 0xff) != SLOT_ACTIVE) continue;
        sum += atomic_load(&d->rg->s[i].mem_used);
    }
    return sum;
}

static void record(struct gl_dev *d, uint64_t bytes) {
    struct rg_header *h = header(d);
    if (!h) return;
    unsigned drv = driver_version();
    if (atomic_load(&h->ctx_measured) == 0 || atomic_load(&h->ctx_driver) != drv) {
        atomic_store(&h->ctx_bytes, bytes);
        atomic_store(&h->ctx_max, bytes);
        atomic_store(&h->ctx_driver, drv);
        atomic_store(&h->ctx_measured, 1);
        GL_LOG(LOG_INFO, "GPU %s: a context costs %llu bytes under driver %u (first measurement)", d->uuid,
               (unsigned long long)bytes, drv);
        return;
    }
    atomic_fetch_add(&h->ctx_measured, 1);
    uint64_t m = atomic_load(&h->ctx_max);
    while (bytes > m && !atomic_compare_exchange_weak(&h->ctx_max, &m, bytes)) {
    }
}

/* ------------------------------------------------------------------ making a context */
static int lock_measure(struct gl_dev *d, int type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = (short)type;
    fl.l_whence = SEEK_SET;
    fl.l_start = RG_CTX_LOCK_OFF;
    fl.l_len = 1;
    if (type == F_UNLCK) return fcntl(d->fd, F_OFD_SETLK, &fl);
    for (int i = 0; i < 500; i++) { /* at most 500 ms, as for every wait on the region */
        if (fcntl(d->fd, F_OFD_SETLK, &fl) == 0) return 0;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) return -1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    GL_LOG(LOG_INFO, "GPU %s: another process has been making a context for 500 ms; this one is not measured",
           d->uuid);
    return -1;
}

static CUresult make_real(int primary, CUcontext *c, unsigned flags, CUdevice dev) {
    return primary ? gl_real_cuDevicePrimaryCtxRetain(c, dev) : gl_real_cuCtxCreate_v2(c, flags, dev);
}

static void undo_real(int primary, CUcontext *c, CUdevice dev) {
    if (primary) gl_real_cuDevicePrimaryCtxRelease_v2(dev);
    else gl_real_cuCtxDestroy_v2(*c);
    *c = NULL;
}

/* Makes the context and measures what it took: *cost, or -1 when it could not be measured.
 *
 * First choice: NVML's figure for this process, when the process is not listed on the GPU before
 * and is after (its first context there): exactly what the driver holds for it, whatever other
 * processes do meanwhile.  Else (a pid namespace of its own, a second context): the GPU's free
 * memory before and after, one measurement at a time, kept only if no process under the limiter
 * allocated, freed or made an unmeasured context meanwhile. */
static CUresult make_measured(struct gl_dev *d, int primary, CUcontext *c, unsigned flags, CUdevice dev,
                              int64_t *cost) {
    *cost = -1;
    uint64_t mine = 0;
    if (own_usage(d, &mine) == 0) {
        CUresult r = make_real(primary, c, flags, dev);
        if (r == CUDA_SUCCESS && own_usage(d, &mine) == 1) {
            uint64_t total = cuda_total(d, dev);
            if (!total || mine <= total) {
                *cost = (int64_t)mine;
                record(d, mine);
            }
        }
        return r;
    }
    struct rg_header *h = header(d);
    if (h && lock_measure(d, F_WRLCK) != 0) {
        atomic_fetch_add(&h->ctx_unmeasured, 1);
        CUresult r = make_real(primary, c, flags, dev);
        atomic_fetch_add(&h->ctx_unmeasured, 1);
        return r;
    }
    uint64_t total = cuda_total(d, dev);
    uint64_t u0 = h ? atomic_load(&h->ctx_unmeasured) : 0, f0 = 0, f1 = 0;
    uint64_t o0 = others_used(d);
    int ok = nv_free(d, &f0);
    CUresult r = make_real(primary, c, flags, dev);
    if (r == CUDA_SUCCESS && ok) ok = nv_free(d, &f1);
    uint64_t o1 = others_used(d);
    int quiet = o1 == o0 && (!h || atomic_load(&h->ctx_unmeasured) == u0);
    if (r == CUDA_SUCCESS && ok && quiet) {
        int64_t delta = (int64_t)f0 - (int64_t)f1;
        if (delta >= 0 && (!total || (uint64_t)delta <= total)) {
            *cost = delta;
            record(d, (uint64_t)delta);
        } else {
            GL_LOG(LOG_WARN, "GPU %s: a context measured %lld bytes, not a plausible figure; charged as unmeasured",
                   d->uuid, (long long)delta);
        }
    }
    if (h) lock_measure(d, F_UNLCK);
    return r;
}

/* Makes a context, charging its cost to the tenant; refused over the cap. */
static CUresult make_charged(struct gl_dev *d, int primary, CUcontext *c, unsigned flags, CUdevice dev,
                             uint64_t *charged) {
    atomic_store(&d->ctx_seen, 1);
    int have;
    uint64_t expected = observed(d, &have);
    if (expected && !gl_mem_reserve(d, expected)) {
        GL_LOG(LOG_INFO, "refused a context on GPU %s: tenant %s at its cap (a context costs %llu bytes there)",
               d->uuid, G.tenant, (unsigned long long)expected);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int64_t measured;
    CUresult r = make_measured(d, primary, c, flags, dev, &measured);
    if (r != CUDA_SUCCESS) {
        if (expected) gl_mem_unreserve(d, expected);
        return r;
    }
    uint64_t cost = measured >= 0 ? (uint64_t)measured : (have ? expected : GL_CTX_DEFAULT_BYTES);
    if (cost > expected && !gl_mem_reserve(d, cost - expected)) {
        undo_real(primary, c, dev);
        if (expected) gl_mem_unreserve(d, expected);
        GL_LOG(LOG_INFO, "refused a context on GPU %s: its %llu bytes would take tenant %s over its cap", d->uuid,
               (unsigned long long)cost, G.tenant);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (cost < expected) gl_mem_unreserve(d, expected - cost);
    *charged = cost;
    return CUDA_SUCCESS;
}

static int primary_active(CUdevice dev) {
    unsigned flags = 0;
    int active = 1; /* cannot tell: it stays charged (the cap errs toward less) */
    if (R.cuDevicePrimaryCtxGetState && R.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
        active = 1;
    return active;
}

/* A device already set up (a release or destroy must not set one up). */
static struct gl_dev *dev_known(int index) {
    if (index < 0 || index >= GL_MAX_DEV) return NULL;
    struct gl_dev *d = &G.dev[index];
    return atomic_load_explicit(&d->state, memory_order_acquire) != 0 ? d : NULL;
}

void gl_ctx_unseen(struct gl_dev *d) {
    if (GL_LIKELY(atomic_load_explicit(&d->ctx_seen, memory_order_relaxed))) return;
    int zero = 0;
    if (!atomic_compare_exchange_strong(&d->ctx_seen, &zero, 1)) return;
    /* The context is there already: its cost is counted, even past the cap. */
    uint64_t cost = unmeasured_cost(d);
    atomic_fetch_add(&d->local_used, cost);
    if (atomic_load_explicit(&d->state, memory_order_acquire) == 1) atomic_fetch_add(&d->me->mem_used, cost);
    GL_LOG(LOG_INFO, "GPU %s: a context made by an entry point the limiter does not wrap; charged %llu bytes",
           d->uuid, (unsigned long long)cost);
}

#define INIT_OR_FAIL(name)                                                 \
    do {                                                                   \
        if (gl_init() != 0) return CUDA_ERROR_NOT_INITIALIZED;             \
        if (!gl_real_##name) return CUDA_ERROR_NOT_SUPPORTED;              \
    } while (0)

GL_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) {
    INIT_OR_FAIL(cuDevicePrimaryCtxRetain);
    struct gl_dev *d = c ? gl_dev_get(dev) : NULL;
    if (!d) return gl_real_cuDevicePrimaryCtxRetain(c, dev);
    pthread_mutex_lock(&d->ctx_mutex);
    CUresult r;
    if (d->primary_on || primary_active(dev)) {
        /* charged already (or made where no wrapper saw it: charged at first use) */
        r = gl_real_cuDevicePrimaryCtxRetain(c, dev);
    } else {
        uint64_t cost = 0;
        r = make_charged(d, 1, c, 0, dev, &cost);
        if (r == CUDA_SUCCESS) {
            d->primary_on = 1;
            d->primary_bytes = cost;
        }
    }
    pthread_mutex_unlock(&d->ctx_mutex);
    return r;
}

/* After a release or a reset: the primary context's charge goes with the context. */
static CUresult primary_gone(CUdevice dev, CUresult (*call)(CUdevice)) {
    struct gl_dev *d = dev_known(dev);
    if (!d) return call(dev);
    pthread_mutex_lock(&d->ctx_mutex);
    CUresult r = call(dev);
    if (r == CUDA_SUCCESS && d->primary_on && !primary_active(dev)) {
        gl_mem_unreserve(d, d->primary_bytes);
        d->primary_on = 0;
        d->primary_bytes = 0;
    }
    pthread_mutex_unlock(&d->ctx_mutex);
    return r;
}

GL_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    INIT_OR_FAIL(cuDevicePrimaryCtxRelease_v2);
    return primary_gone(dev, gl_real_cuDevicePrimaryCtxRelease_v2);
}

GL_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    INIT_OR_FAIL(cuDevicePrimaryCtxReset_v2);
    return primary_gone(dev, gl_real_cuDevicePrimaryCtxReset_v2);
}

GL_EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice dev) {
    INIT_OR_FAIL(cuCtxCreate_v2);
    struct gl_dev *d = c ? gl_dev_get(dev) : NULL;
    if (!d) return gl_real_cuCtxCreate_v2(c, flags, dev);
    pthread_mutex_lock(&d->ctx_mutex);
    uint64_t cost = 0;
    CUresult r = make_charged(d, 0, c, flags, dev, &cost);
    pthread_mutex_unlock(&d->ctx_mutex);
    if (r == CUDA_SUCCESS) gl_track_put((uint64_t)(uintptr_t)*c, GL_TK_CTX, d->index, cost);
    return r;
}

GL_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    INIT_OR_FAIL(cuCtxDestroy_v2);
    int dev;
    uint64_t size;
    int had = gl_track_take((uint64_t)(uintptr_t)c, GL_TK_CTX, &dev, &size);
    CUresult r = gl_real_cuCtxDestroy_v2(c);
    if (had) {
        if (r == CUDA_SUCCESS) {
            struct gl_dev *d = dev_known(dev);
            if (d) gl_mem_unreserve(d, size);
        } else {
            gl_track_put((uint64_t)(uintptr_t)c, GL_TK_CTX, dev, size);
        }
    }
    return r;
}
