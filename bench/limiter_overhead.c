/*
 * Micro-benchmark for bench/limiter_overhead.py: the cost of driver calls, run once without
 * and once with libgpuops-limiter.so preloaded, against the fake driver of tests/native.
 *
 *   limiter_overhead launch N       N cuLaunchKernel calls of an empty kernel (ns per call)
 *   limiter_overhead alloc N SIZE   N cuMemAlloc_v2 + cuMemFree_v2 pairs (ns per pair, wall and CPU)
 *   limiter_overhead startgate      waits for a line on stdin before starting (many at once)
 */
#define _GNU_SOURCE
#include "gpuops_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern CUresult cuInit(unsigned);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuCtxSynchronize(void);
extern CUresult cuModuleLoadData(CUmodule *, const void *);
extern CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
extern CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
extern CUresult cuMemFree_v2(CUdeviceptr);

static uint64_t ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define CHECK(x)                                                        \
    do {                                                                \
        CUresult r_ = (x);                                              \
        if (r_) {                                                       \
            fprintf(stderr, "%s failed: %d\n", #x, r_);                 \
            return 1;                                                   \
        }                                                               \
    } while (0)

int main(int argc, char **argv) {
    int i = 1;
    if (i < argc && !strcmp(argv[i], "startgate")) {
        char buf[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(buf, sizeof buf, stdin)) return 1;
        i++;
    }
    if (i >= argc) return 2;
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    if (!strcmp(argv[i], "launch") && i + 1 < argc) {
        long n = atol(argv[i + 1]);
        CUmodule m;
        CUfunction f;
        CHECK(cuModuleLoadData(&m, "bench"));
        CHECK(cuModuleGetFunction(&f, m, "empty"));
        uint64_t dur = 0;
        void *params[] = {&dur};
        for (int k = 0; k < 2000; k++) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
        CHECK(cuCtxSynchronize());
        uint64_t t0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID);
        for (long k = 0; k < n; k++) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
        uint64_t t1 = ns(CLOCK_MONOTONIC), c1 = ns(CLOCK_THREAD_CPUTIME_ID);
        CHECK(cuCtxSynchronize());
        printf("launch %.1f %.1f\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n);
    } else if (!strcmp(argv[i], "alloc") && i + 2 < argc) {
        long n = atol(argv[i + 1]);
        size_t size = (size_t)atoll(argv[i + 2]);
        CUdeviceptr p;
        for (int k = 0; k < 100; k++) {
            CHECK(cuMemAlloc_v2(&p, size));
            CHECK(cuMemFree_v2(p));
        }
        uint64_t t0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID);
        for (long k = 0; k < n; k++) {
            CHECK(cuMemAlloc_v2(&p, size));
            CHECK(cuMemFree_v2(p));
        }
        uint64_t t1 = ns(CLOCK_MONOTONIC), c1 = ns(CLOCK_THREAD_CPUTIME_ID);
        printf("alloc %.1f %.1f\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n);
    } else {
        return 2;
    }
    return 0;
}
