/*
 * cudaprog: a scriptable CUDA driver-API program for the limiter tests.
 *
 *   cudaprog [--via linked|dlopen|procaddr|procaddr_v2|procaddr_ptsz] CMD ARGS... CMD ARGS...
 *
 * Each command prints one line "<cmd> <results...>" so tests can read what a user would see.
 */
#define _GNU_SOURCE
#include "common.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

static struct api A;
static CUfunction g_fn;
static CUcontext g_ctx[16];
static int g_nctx;

enum { K_MEM = 1, K_ASYNC, K_HANDLE, K_ARRAY, K_MIPMAP };
struct held { int kind; uint64_t h; };
static struct held g_held[65536];
static int g_nheld;

static void push(int kind, uint64_t h) {
    if (g_nheld < 65536) g_held[g_nheld++] = (struct held){kind, h};
}

static CUresult release(struct held *x) {
    switch (x->kind) {
    case K_MEM: return A.cuMemFree_v2(x->h);
    case K_ASYNC: {
        CUresult r = A.cuMemFreeAsync(x->h, NULL);
        if (r == CUDA_SUCCESS) r = A.cuStreamSynchronize(NULL);
        return r;
    }
    case K_HANDLE: return A.cuMemRelease(x->h);
    case K_ARRAY: return A.cuArrayDestroy((CUarray)(uintptr_t)x->h);
    case K_MIPMAP: return A.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)x->h);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static unsigned long long num(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end == 'k' || *end == 'K') v <<= 10;
    else if (*end == 'm' || *end == 'M') v <<= 20;
    else if (*end == 'g' || *end == 'G') v <<= 30;
    return v;
}

static CUresult ensure_fn(void) {
    if (g_fn) return CUDA_SUCCESS;
    CUmodule m;
    CUresult r = A.cuModuleLoadData(&m, "fake-cubin");
    if (r) return r;
    return A.cuModuleGetFunction(&g_fn, m, "spin");
}

/* Launch one unit of work of duration dur through the given path. */
static CUresult launch_one(const char *path, uint64_t dur, CUstream s) {
    void *params[] = {&dur};
    if (strcmp(path, "kernel") == 0) return A.cuLaunchKernel(g_fn, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
    if (strcmp(path, "coop") == 0) return A.cuLaunchCooperativeKernel(g_fn, 1, 1, 1, 32, 1, 1, 0, s, params);
    if (strcmp(path, "ex") == 0) {
        CUlaunchConfig c;
        memset(&c, 0, sizeof c);
        c.gridDimX = c.gridDimY = c.gridDimZ = 1;
        c.blockDimX = 32;
        c.blockDimY = c.blockDimZ = 1;
        c.hStream = s;
        return A.cuLaunchKernelEx(&c, g_fn, params, NULL);
    }
    if (strcmp(path, "graph") == 0) {
        static CUgraphExec exec;
        static uint64_t exec_dur;
        if (!exec || exec_dur != dur) {
            CUgraph g;
            CUresult r = A.cuGraphCreate(&g, 0);
            if (r) return r;
            uint64_t part = dur / 4;
            void *pp[] = {&part};
            CUDA_KERNEL_NODE_PARAMS np;
            memset(&np, 0, sizeof np);
            np.func = g_fn;
            np.gridDimX = np.gridDimY = np.gridDimZ = 1;
            np.blockDimX = 32;
            np.blockDimY = np.blockDimZ = 1;
            np.kernelParams = pp;
            for (int i = 0; i < 4; i++) {
                CUgraphNode n;
                r = A.cuGraphAddKernelNode(&n, g, NULL, 0, &np);
                if (r) return r;
            }
            r = A.cuGraphInstantiateWithFlags(&exec, g, 0);
            if (r) return r;
            exec_dur = dur;
        }
        return A.cuGraphLaunch(exec, s);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static volatile uint64_t *g_progress;

static void progress_open(void) {
    const char *f = getenv("PROGRESS_FILE");
    const char *slot = getenv("PROGRESS_SLOT");
    if (!f || !slot) return;
    int fd = open(f, O_RDWR);
    if (fd < 0) return;
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    g_progress = (volatile uint64_t *)p + 2 * atoi(slot);
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    const char *via = "linked";
    if (i + 1 < argc && strcmp(argv[i], "--via") == 0) {
        via = argv[i + 1];
        i += 2;
    }
    if (load_api(&A, via) != 0) {
        printf("load failed\n");
        return 2;
    }
    while (i < argc) {
        const char *c = argv[i++];
#define ARG() (i < argc ? argv[i++] : "0")
        if (strcmp(c, "init") == 0) {
            CUresult r = A.cuInit(0);
            CUdevice d = 0;
            CUcontext ctx = NULL;
            if (!r) r = A.cuDeviceGet(&d, 0);
            if (!r) r = A.cuDevicePrimaryCtxRetain(&ctx, d);
            if (!r) r = A.cuCtxSetCurrent(ctx);
            printf("init %d\n", r);
            if (r) return 1;
        } else if (strcmp(c, "dev") == 0) {
            CUdevice d = 0;
            CUcontext ctx = NULL;
            CUresult r = A.cuDeviceGet(&d, (int)num(ARG()));
            if (!r) r = A.cuDevicePrimaryCtxRetain(&ctx, d);
            if (!r) r = A.cuCtxSetCurrent(ctx);
            printf("dev %d\n", r);
        } else if (strcmp(c, "cuinit") == 0) {
            printf("cuinit %d\n", A.cuInit(0));
        } else if (strcmp(c, "ctx") == 0) {
            /* a context of its own on device N (cuCtxCreate makes it current) */
            CUresult r = A.cuCtxCreate_v2(&g_ctx[g_nctx < 16 ? g_nctx : 15], 0, (CUdevice)num(ARG()));
            if (!r && g_nctx < 16) g_nctx++;
            printf("ctx %d\n", r);
        } else if (strcmp(c, "ctxdestroy") == 0) {
            CUresult r = g_nctx ? A.cuCtxDestroy_v2(g_ctx[--g_nctx]) : CUDA_ERROR_INVALID_CONTEXT;
            printf("ctxdestroy %d\n", r);
        } else if (strcmp(c, "release") == 0) {
            CUresult r = A.cuDevicePrimaryCtxRelease_v2((CUdevice)num(ARG()));
            printf("release %d\n", r);
        } else if (strcmp(c, "alloc") == 0 || strcmp(c, "managed") == 0 || strcmp(c, "async") == 0 ||
                   strcmp(c, "pool") == 0) {
            size_t size = num(ARG());
            CUdeviceptr p = 0;
            CUresult r;
            int kind = K_MEM;
            if (c[0] == 'a' && c[1] == 'l') {
                r = A.cuMemAlloc_v2(&p, size);
            } else if (c[0] == 'm') {
                r = A.cuMemAllocManaged(&p, size, 1);
            } else if (c[0] == 'a') {
                r = A.cuMemAllocAsync(&p, size, NULL);
                kind = K_ASYNC;
            } else {
                CUmemoryPool pool;
                r = A.cuDeviceGetDefaultMemPool(&pool, 0);
                if (!r) r = A.cuMemAllocFromPoolAsync(&p, size, pool, NULL);
                kind = K_ASYNC;
            }
            if (!r) push(kind, p);
            printf("%s %d\n", c, r);
        } else if (strcmp(c, "pitch") == 0) {
            size_t w = num(ARG()), h = num(ARG()), pitch = 0;
            CUdeviceptr p = 0;
            CUresult r = A.cuMemAllocPitch_v2(&p, &pitch, w, h, 4);
            if (!r) push(K_MEM, p);
            printf("pitch %d %zu\n", r, pitch);
        } else if (strcmp(c, "create") == 0 || strcmp(c, "createhost") == 0) {
            size_t size = num(ARG());
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = strcmp(c, "create") == 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
            prop.location.id = 0;
            CUmemGenericAllocationHandle h = 0;
            CUresult r = A.cuMemCreate(&h, size, &prop, 0);
            if (!r) push(K_HANDLE, h);
            printf("%s %d\n", c, r);
        } else if (strcmp(c, "array") == 0) {
            CUDA_ARRAY_DESCRIPTOR d = {num(ARG()), num(ARG()), CU_AD_FORMAT_FLOAT, 4};
            CUarray a = NULL;
            CUresult r = A.cuArrayCreate_v2(&a, &d);
            if (!r) push(K_ARRAY, (uintptr_t)a);
            printf("array %d\n", r);
        } else if (strcmp(c, "array3d") == 0) {
            CUDA_ARRAY3D_DESCRIPTOR d = {num(ARG()), num(ARG()), num(ARG()), CU_AD_FORMAT_FLOAT, 4, 0};
            CUarray a = NULL;
            CUresult r = A.cuArray3DCreate_v2(&a, &d);
            if (!r) push(K_ARRAY, (uintptr_t)a);
            printf("array3d %d\n", r);
        } else if (strcmp(c, "mipmap") == 0) {
            CUDA_ARRAY3D_DESCRIPTOR d = {num(ARG()), num(ARG()), num(ARG()), CU_AD_FORMAT_FLOAT, 4, 0};
            unsigned levels = (unsigned)num(ARG());
            CUmipmappedArray m = NULL;
            CUresult r = A.cuMipmappedArrayCreate(&m, &d, levels);
            if (!r) push(K_MIPMAP, (uintptr_t)m);
            printf("mipmap %d\n", r);
        } else if (strcmp(c, "free") == 0) {
            CUresult r = g_nheld ? release(&g_held[--g_nheld]) : CUDA_ERROR_INVALID_VALUE;
            printf("free %d\n", r);
        } else if (strcmp(c, "freeall") == 0) {
            CUresult worst = CUDA_SUCCESS;
            while (g_nheld) {
                CUresult r = release(&g_held[--g_nheld]);
                if (r) worst = r;
            }
            printf("freeall %d\n", worst);
        } else if (strcmp(c, "fill") == 0) {
            size_t step = num(ARG());
            int n = 0;
            CUresult r;
            for (;;) {
                CUdeviceptr p;
                r = A.cuMemAlloc_v2(&p, step);
                if (r) break;
                push(K_MEM, p);
                n++;
            }
            printf("fill %d %d\n", n, r);
        } else if (strcmp(c, "info") == 0) {
            size_t f = 0, t = 0;
            CUresult r = A.cuMemGetInfo_v2(&f, &t);
            printf("info %d %zu %zu\n", r, f, t);
        } else if (strcmp(c, "totalmem") == 0) {
            size_t t = 0;
            CUresult r = A.cuDeviceTotalMem_v2(&t, 0);
            printf("totalmem %d %zu\n", r, t);
        } else if (strcmp(c, "nvml") == 0) {
            void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
            if (!h) {
                printf("nvml noload\n");
                continue;
            }
            nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
            nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) =
                (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
            nvmlReturn_t (*mi)(nvmlDevice_t, nvmlMemory_t *) =
                (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
            nvmlReturn_t (*mi2)(nvmlDevice_t, nvmlMemory_v2_t *) =
                (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
            nvmlDevice_t dev;
            nvmlMemory_t m = {0, 0, 0};
            nvmlMemory_v2_t m2;
            memset(&m2, 0, sizeof m2);
            m2.version = nvmlMemory_v2;
            int r = init();
            if (!r) r = get(0, &dev);
            if (!r) r = mi(dev, &m);
            int r2 = r ? r : mi2(dev, &m2);
            printf("nvml %d %llu %llu %llu %d %llu %llu %llu\n", r, m.total, m.used, m.free, r2, m2.total, m2.used,
                   m2.free);
        } else if (strcmp(c, "sleep") == 0) {
            usleep((useconds_t)(num(ARG()) * 1000));
        } else if (strcmp(c, "ready") == 0) {
            printf("ready\n");
        } else if (strcmp(c, "wait") == 0) {
            char buf[64];
            if (!fgets(buf, sizeof buf, stdin)) {
                /* stdin closed: go on */
            }
        } else if (strcmp(c, "launch") == 0) {
            unsigned long long n = num(ARG()), dur = num(ARG());
            const char *path = ARG();
            CUresult r = ensure_fn();
            for (unsigned long long k = 0; k < n && !r; k++) r = launch_one(path, dur, NULL);
            if (!r) r = A.cuCtxSynchronize();
            printf("launch %d\n", r);
        } else if (strcmp(c, "spin") == 0) {
            /* Saturate the GPU for SECONDS with kernels of DUR ns, as a training loop would:
             * launches are asynchronous, with a synchronisation every SYNC launches. */
            double secs = atof(ARG());
            unsigned long long dur = num(ARG());
            const char *path = ARG();
            unsigned long long sync_every = num(ARG());
            if (!sync_every) sync_every = 64;
            CUresult r = ensure_fn();
            double t0 = now_s();
            unsigned long long n = 0;
            while (!r && now_s() - t0 < secs) {
                r = launch_one(path, dur, NULL);
                n++;
                if (!r && n % sync_every == 0) r = A.cuStreamSynchronize(NULL);
            }
            if (!r) r = A.cuCtxSynchronize();
            printf("spin %llu %d %.3f\n", n, r, now_s() - t0);
        } else if (strcmp(c, "elapsed") == 0) {
            unsigned long long dur = num(ARG());
            CUevent a, b;
            float ms = -1;
            CUresult r = ensure_fn();
            if (!r) r = A.cuEventCreate(&a, 0);
            if (!r) r = A.cuEventCreate(&b, 0);
            if (!r) r = A.cuEventRecord(a, NULL);
            if (!r) r = launch_one("kernel", dur, NULL);
            if (!r) r = A.cuEventRecord(b, NULL);
            if (!r) r = A.cuEventSynchronize(b);
            if (!r) r = A.cuEventElapsedTime(&ms, a, b);
            printf("elapsed %d %.4f\n", r, ms);
        } else if (strcmp(c, "allocloop") == 0) {
            /* Allocate and free random sizes for SECONDS, reporting progress into PROGRESS_FILE:
             * slot[0] = time of the last completed call, slot[1] = longest call so far (ns). */
            double secs = atof(ARG());
            size_t maxsize = num(ARG());
            progress_open();
            unsigned seed = (unsigned)getpid();
            double t0 = now_s();
            unsigned long long n = 0, ooms = 0, worst = 0;
            while (now_s() - t0 < secs) {
                size_t size = 1 + (size_t)(rand_r(&seed) % maxsize);
                CUdeviceptr p;
                uint64_t a = mono_ns();
                CUresult r = A.cuMemAlloc_v2(&p, size);
                uint64_t b = mono_ns();
                if (r == CUDA_SUCCESS) {
                    if (rand_r(&seed) % 2) push(K_MEM, p);
                    else A.cuMemFree_v2(p);
                } else {
                    ooms++;
                    while (g_nheld) release(&g_held[--g_nheld]);
                }
                uint64_t c2 = mono_ns();
                if (c2 - a > worst) worst = c2 - a;
                (void)b;
                if (g_progress) {
                    g_progress[1] = worst;
                    g_progress[0] = c2;
                }
                n++;
            }
            printf("allocloop %llu %llu %llu\n", n, ooms, worst);
        } else {
            printf("unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
