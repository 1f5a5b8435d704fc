/*
 * Memory caps per tenant per GPU, summed over all processes of the tenant, on every allocation
 * and every free path.  Over the cap a call returns CUDA_ERROR_OUT_OF_MEMORY without allocating.
 *
 * Accounting is "reserve, allocate, confirm": the process's own slot counter is raised first
 * (an atomic add), then the tenant's sum over its member slots is compared with the cap.  Two
 * processes reserving at the same time both see each other's reservation (sequentially
 * consistent atomics), so the cap can be missed by neither; at worst both are refused.  A dead
 * process's usage disappears with its slot, so it returns exactly to zero.
 */
#define _GNU_SOURCE
#include "hooklist.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ tracking of live allocations */
enum { TK_PTR = 1, TK_HANDLE, TK_ARRAY, TK_MIPMAP, TK_POOL };

struct track {
    uint64_t key;
    uint64_t size;
    int kind;
    int dev;
    struct track *next;
};

#define STRIPES 64
#define BUCKETS 4096
static struct {
    pthread_mutex_t m;
    struct track *free_list;
} g_stripe[STRIPES];
static struct track *g_bucket[BUCKETS];
static pthread_once_t g_track_once = PTHREAD_ONCE_INIT;

static void track_init(void) {
    for (int i = 0; i < STRIPES; i++) pthread_mutex_init(&g_stripe[i].m, NULL);
}

static unsigned bucket_of(uint64_t key, int kind) {
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 52) % BUCKETS;
}

void gl_track_put(uint64_t key, int kind, int dev, uint64_t size) {
    pthread_once(&g_track_once, track_init);
    unsigned b = bucket_of(key, kind);
    pthread_mutex_t *m = &g_stripe[b % STRIPES].m;
    pthread_mutex_lock(m);
    struct track *t = g_stripe[b % STRIPES].free_list;
    if (t) g_stripe[b % STRIPES].free_list = t->next;
    else t = malloc(sizeof *t);
    if (t) {
        t->key = key;
        t->size = size;
        t->kind = kind;
        t->dev = dev;
        t->next = g_bucket[b];
        g_bucket[b] = t;
    }
    pthread_mutex_unlock(m);
}

static int track_find(uint64_t key, int kind, int *dev, uint64_t *size, int remove) {
    pthread_once(&g_track_once, track_init);
    unsigned b = bucket_of(key, kind);
    pthread_mutex_t *m = &g_stripe[b % STRIPES].m;
    pthread_mutex_lock(m);
    for (struct track **pp = &g_bucket[b]; *pp; pp = &(*pp)->next) {
        struct track *t = *pp;
        if (t->key == key && t->kind == kind) {
            *dev = t->dev;
            *size = t->size;
            if (remove) {
                *pp = t->next;
                t->next = g_stripe[b % STRIPES].free_list;
                g_stripe[b % STRIPES].free_list = t;
            }
            pthread_mutex_unlock(m);
            return 1;
        }
    }
    pthread_mutex_unlock(m);
    return 0;
}

int gl_track_take(uint64_t key, int kind, int *dev, uint64_t *size) { return track_find(key, kind, dev, size, 1); }

/* ------------------------------------------------------------------ reservation */
uint64_t gl_mem_limit(struct gl_dev *d) { return d->cfg.mem_limit; }

int gl_mem_reserve(struct gl_dev *d, uint64_t size) {
    gl_maybe_reload();
    uint64_t limit = d->cfg.mem_limit; /* GL_MEM_NONE: no size is over it */
    if (size > limit) return 0;
    uint64_t mine = atomic_fetch_add(&d->local_used, size) + size;
    if (atomic_load_explicit(&d->state, memory_order_acquire) != 1) {
        /* no shared region: the cap applies to this process alone */
        if (mine > limit) {
            atomic_fetch_sub(&d->local_used, size);
            return 0;
        }
        return 1;
    }
    atomic_fetch_add(&d->me->mem_used, size);
    if (limit == GL_MEM_NONE) return 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (gl_tenant_mem_used(d) <= limit) return 1;
        /* over the cap: first make sure no dead process's usage is counted */
        if (attempt == 0 && gl_reclaim_dead(d, 1) == 0) break;
    }
    atomic_fetch_sub(&d->me->mem_used, size);
    atomic_fetch_sub(&d->local_used, size);
    GL_LOG(LOG_INFO, "refused %llu bytes on GPU %s: tenant %s at its cap of %llu bytes", (unsigned long long)size,
           d->uuid, G.tenant, (unsigned long long)limit);
    return 0;
}

void gl_mem_unreserve(struct gl_dev *d, uint64_t size) {
    atomic_fetch_sub(&d->local_used, size);
    if (atomic_load_explicit(&d->state, memory_order_acquire) == 1) atomic_fetch_sub(&d->me->mem_used, size);
}

/* The free paths: look the allocation up first, and give the reservation back only once the
 * driver has actually freed it. */
#define FREE_PATH(kind, key, call)                                    \
    do {                                                              \
        int dev_;                                                     \
        uint64_t size_;                                               \
        int had_ = gl_track_take((key), (kind), &dev_, &size_);       \
        CUresult r_ = (call);                                         \
        if (had_) {                                                   \
            if (r_ == CUDA_SUCCESS) {                                 \
                struct gl_dev *d_ = gl_dev_get(dev_);                 \
                if (d_) gl_mem_unreserve(d_, size_);                  \
            } else {                                                  \
                gl_track_put((key), (kind), dev_, size_);             \
            }                                                         \
        }                                                             \
        return r_;                                                    \
    } while (0)

#define INIT_OR_FAIL()                                                     \
    do {                                                                   \
        if (gl_init() != 0) return CUDA_ERROR_NOT_INITIALIZED;             \
    } while (0)
#define REAL_OR_FAIL(name)                                                 \
    do {                                                                   \
        INIT_OR_FAIL();                                                    \
        if (!gl_real_##name) return CUDA_ERROR_NOT_SUPPORTED;              \
    } while (0)

/* Allocate through `call` on device d, accounting `size` bytes under key *keyp. */
#define ALLOC_PATH(d, size, kind, call, keyexpr)                          \
    do {                                                                  \
        if (!(d)) return (call);                                          \
        gl_ctx_unseen(d);                                                 \
        if (!gl_mem_reserve((d), (size))) return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = (call);                                             \
        if (r_ != CUDA_SUCCESS) {                                         \
            gl_mem_unreserve((d), (size));                                \
            return r_;                                                    \
        }                                                                 \
        gl_track_put((uint64_t)(keyexpr), (kind), (d)->index, (size));    \
        return r_;                                                        \
    } while (0)

GL_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    REAL_OR_FAIL(cuMemAlloc_v2);
    if (!p || !size) return gl_real_cuMemAlloc_v2(p, size);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAlloc_v2(p, size), *p);
}

GL_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags) {
    REAL_OR_FAIL(cuMemAllocManaged);
    if (!p || !size) return gl_real_cuMemAllocManaged(p, size, flags);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAllocManaged(p, size, flags), *p);
}

GL_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned elem) {
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    struct gl_dev *d = gl_dev_current();
    if (!d || !p || !pitch || !w || !h) return gl_real_cuMemAllocPitch_v2(p, pitch, w, h, elem);
    /* Reserve the least it can take, then the real pitch x height the driver chose. */
    gl_ctx_unseen(d);
    uint64_t least = (uint64_t)w * h;
    if (!gl_mem_reserve(d, least)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = gl_real_cuMemAllocPitch_v2(p, pitch, w, h, elem);
    if (r != CUDA_SUCCESS) {
        gl_mem_unreserve(d, least);
        return r;
    }
    uint64_t real = (uint64_t)*pitch * h;
    if (real > least && !gl_mem_reserve(d, real - least)) {
        gl_real_cuMemFree_v2(*p);
        gl_mem_unreserve(d, least);
        *p = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (real < least) gl_mem_unreserve(d, least - real);
    gl_track_put(*p, TK_PTR, d->index, real);
    return r;
}

GL_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    REAL_OR_FAIL(cuMemFree_v2);
    FREE_PATH(TK_PTR, p, gl_real_cuMemFree_v2(p));
}

/* Stream-ordered allocation: the pool decides the device. */
static struct gl_dev *pool_dev(CUmemoryPool pool) {
    int dev;
    uint64_t size;
    if (pool && track_find((uint64_t)(uintptr_t)pool, TK_POOL, &dev, &size, 0)) return gl_dev_get(dev);
    return gl_dev_current();
}

GL_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    REAL_OR_FAIL(cuMemPoolCreate);
    CUresult r = gl_real_cuMemPoolCreate(pool, props);
    if (r == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        gl_track_put((uint64_t)(uintptr_t)*pool, TK_POOL, props->location.id, 0);
    return r;
}

GL_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    REAL_OR_FAIL(cuDeviceGetDefaultMemPool);
    CUresult r = gl_real_cuDeviceGetDefaultMemPool(pool, dev);
    int odev;
    uint64_t osize;
    if (r == CUDA_SUCCESS && pool && !track_find((uint64_t)(uintptr_t)*pool, TK_POOL, &odev, &osize, 0))
        gl_track_put((uint64_t)(uintptr_t)*pool, TK_POOL, dev, 0);
    return r;
}

GL_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    REAL_OR_FAIL(cuMemAllocAsync);
    if (!p || !size) return gl_real_cuMemAllocAsync(p, size, s);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAllocAsync(p, size, s), *p);
}

GL_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) {
    REAL_OR_FAIL(cuMemAllocAsync_ptsz);
    if (!p || !size) return gl_real_cuMemAllocAsync_ptsz(p, size, s);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAllocAsync_ptsz(p, size, s), *p);
}

GL_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    REAL_OR_FAIL(cuMemAllocFromPoolAsync);
    if (!p || !size || !pool) return gl_real_cuMemAllocFromPoolAsync(p, size, pool, s);
    struct gl_dev *d = pool_dev(pool);
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAllocFromPoolAsync(p, size, pool, s), *p);
}

GL_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    REAL_OR_FAIL(cuMemAllocFromPoolAsync_ptsz);
    if (!p || !size || !pool) return gl_real_cuMemAllocFromPoolAsync_ptsz(p, size, pool, s);
    struct gl_dev *d = pool_dev(pool);
    ALLOC_PATH(d, size, TK_PTR, gl_real_cuMemAllocFromPoolAsync_ptsz(p, size, pool, s), *p);
}

GL_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    REAL_OR_FAIL(cuMemFreeAsync);
    FREE_PATH(TK_PTR, p, gl_real_cuMemFreeAsync(p, s));
}

GL_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    REAL_OR_FAIL(cuMemFreeAsync_ptsz);
    FREE_PATH(TK_PTR, p, gl_real_cuMemFreeAsync_ptsz(p, s));
}

/* Physical allocations of the virtual memory API (PyTorch expandable segments): counted when
 * they are on a device, by handle, until cuMemRelease. */
GL_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    REAL_OR_FAIL(cuMemCreate);
    if (!h || !size || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return gl_real_cuMemCreate(h, size, prop, flags);
    struct gl_dev *d = gl_dev_get(prop->location.id);
    ALLOC_PATH(d, size, TK_HANDLE, gl_real_cuMemCreate(h, size, prop, flags), *h);
}

GL_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    REAL_OR_FAIL(cuMemRelease);
    FREE_PATH(TK_HANDLE, h, gl_real_cuMemRelease(h));
}

/* Arrays: the driver does not say how much it allocates, so the size is computed from the
 * descriptor (unknown formats are counted at 16 bytes per element, erring toward the cap). */
static uint64_t format_bytes(int fmt) {
    switch (fmt) {
    case 0x01: case 0x08: return 1;             /* (UN)SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2;  /* (UN)SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4;  /* (UN)SIGNED_INT32, FLOAT */
    case 0xc0: return 1;                        /* UNORM_INT8X1 */
    case 0xc1: return 2;
    case 0xc2: return 4;
    case 0xc3: return 2;                        /* UNORM_INT16X1 */
    case 0xc4: return 4;
    case 0xc5: return 8;
    default: return 16;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t depth, int fmt, unsigned ch) {
    return (uint64_t)w * (h ? h : 1) * (depth ? depth : 1) * format_bytes(fmt) * (ch ? ch : 1);
}

GL_EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc) {
    REAL_OR_FAIL(cuArrayCreate_v2);
    if (!a || !desc || !desc->Width) return gl_real_cuArrayCreate_v2(a, desc);
    uint64_t size = array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_ARRAY, gl_real_cuArrayCreate_v2(a, desc), (uintptr_t)*a);
}

GL_EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    REAL_OR_FAIL(cuArray3DCreate_v2);
    if (!a || !desc || !desc->Width) return gl_real_cuArray3DCreate_v2(a, desc);
    uint64_t size = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_ARRAY, gl_real_cuArray3DCreate_v2(a, desc), (uintptr_t)*a);
}

GL_EXPORT CUresult cuArrayDestroy(CUarray a) {
    REAL_OR_FAIL(cuArrayDestroy);
    FREE_PATH(TK_ARRAY, (uintptr_t)a, gl_real_cuArrayDestroy(a));
}

GL_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    if (!m || !desc || !desc->Width || !levels) return gl_real_cuMipmappedArrayCreate(m, desc, levels);
    int layered = (desc->Flags & CUDA_ARRAY3D_LAYERED) != 0;
    uint64_t size = 0;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        size_t w = desc->Width >> l, h = desc->Height >> l, z = layered ? desc->Depth : desc->Depth >> l;
        if (!w) w = 1;
        if (desc->Height && !h) h = 1;
        if (desc->Depth && !z) z = 1;
        size += array_bytes(w, h, z, desc->Format, desc->NumChannels);
    }
    struct gl_dev *d = gl_dev_current();
    ALLOC_PATH(d, size, TK_MIPMAP, gl_real_cuMipmappedArrayCreate(m, desc, levels), (uintptr_t)*m);
}

GL_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    REAL_OR_FAIL(cuMipmappedArrayDestroy);
    FREE_PATH(TK_MIPMAP, (uintptr_t)m, gl_real_cuMipmappedArrayDestroy(m));
}

/* ------------------------------------------------------------------ the tenant's view */
GL_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    REAL_OR_FAIL(cuMemGetInfo_v2);
    CUresult r = gl_real_cuMemGetInfo_v2(free_b, total_b);
    if (r != CUDA_SUCCESS || !free_b || !total_b) return r;
    struct gl_dev *d = gl_dev_current();
    if (!d || d->cfg.mem_limit == GL_MEM_NONE) return r;
    gl_ctx_unseen(d);
    uint64_t limit = d->cfg.mem_limit, used;
    if (atomic_load(&d->state) == 1) {
        static _Atomic uint64_t next_sweep;
        uint64_t now = gl_now_ns(), ns = atomic_load(&next_sweep);
        if (now >= ns && atomic_compare_exchange_strong(&next_sweep, &ns, now + 1000000000ull)) gl_reclaim_dead(d, 1);
        used = gl_tenant_mem_used(d);
    } else {
        used = atomic_load(&d->local_used);
    }
    size_t total = *total_b < limit ? *total_b : (size_t)limit;
    size_t room = used < total ? total - (size_t)used : 0;
    *total_b = total;
    if (*free_b > room) *free_b = room;
    return r;
}

GL_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    CUresult r = gl_real_cuDeviceTotalMem_v2(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes) return r;
    struct gl_dev *d = gl_dev_get(dev);
    if (d && *bytes > d->cfg.mem_limit) *bytes = (size_t)d->cfg.mem_limit;
    return r;
}

