/* Driver entry points of the test programs, resolved the way real programs resolve them. */
#ifndef TESTPROG_COMMON_H
#define TESTPROG_COMMON_H
#include "gpuops_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API_LIST(X)                                                                                  \
    X(cuInit, CUresult, (unsigned))                                                                  \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                                      \
    X(cuDeviceGetCount, CUresult, (int *))                                                           \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                                           \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                                   \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                            \
    X(cuCtxCreate_v2, CUresult, (CUcontext *, unsigned, CUdevice))                                   \
    X(cuCtxDestroy_v2, CUresult, (CUcontext))                                                        \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                                        \
    X(cuCtxSynchronize, CUresult, (void))                                                            \
    X(cuMemGetInfo_v2, CUresult, (size_t *, size_t *))                                               \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                              \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                         \
    X(cuMemAllocPitch_v2, CUresult, (CUdeviceptr *, size_t *, size_t, size_t, unsigned))             \
    X(cuMemAllocManaged, CUresult, (CUdeviceptr *, size_t, unsigned))                                \
    X(cuMemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream))                                  \
    X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))            \
    X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                             \
    X(cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool *, CUdevice))                               \
    X(cuMemCreate, CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,  \
                              unsigned long long))                                                   \
    X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                                        \
    X(cuArrayCreate_v2, CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                        \
    X(cuArray3DCreate_v2, CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                    \
    X(cuArrayDestroy, CUresult, (CUarray))                                                           \
    X(cuMipmappedArrayCreate, CUresult, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)) \
    X(cuMipmappedArrayDestroy, CUresult, (CUmipmappedArray))                                         \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                        \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                         \
    X(cuLaunchKernel, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,       \
                                 unsigned, unsigned, CUstream, void **, void **))                    \
    X(cuLaunchKernelEx, CUresult, (const CUlaunchConfig *, CUfunction, void **, void **))            \
    X(cuLaunchCooperativeKernel, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned,      \
                                            unsigned, unsigned, unsigned, CUstream, void **))        \
    X(cuGraphCreate, CUresult, (CUgraph *, unsigned))                                                \
    X(cuGraphAddKernelNode, CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,          \
                                       const CUDA_KERNEL_NODE_PARAMS *))                             \
    X(cuGraphInstantiateWithFlags, CUresult, (CUgraphExec *, CUgraph, unsigned long long))           \
    X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                                              \
    X(cuStreamSynchronize, CUresult, (CUstream))                                                     \
    X(cuEventCreate, CUresult, (CUevent *, unsigned))                                                \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                                  \
    X(cuEventSynchronize, CUresult, (CUevent))                                                       \
    X(cuEventElapsedTime, CUresult, (float *, CUevent, CUevent))

/* Declarations for programs linked with -lcuda. */
#define X(name, ret, args) extern ret name args;
API_LIST(X)
#undef X

struct api {
#define X(name, ret, args) ret(*name) args;
    API_LIST(X)
#undef X
};

/* Names as a program asks cuGetProcAddress for them: without the _vN suffix. */
static inline const char *base_name(const char *sym, char *buf, size_t n) {
    snprintf(buf, n, "%s", sym);
    char *v = strstr(buf, "_v2");
    if (v && v[3] == 0) *v = 0;
    if (strcmp(buf, "cuGraphInstantiateWithFlags") == 0) snprintf(buf, n, "cuGraphInstantiate");
    return buf;
}

/* how: linked | dlopen | procaddr | procaddr_v2 | procaddr_ptsz */
static inline int load_api(struct api *a, const char *how) {
    if (strcmp(how, "linked") == 0) {
#define X(name, ret, args) a->name = name;
        API_LIST(X)
#undef X
        return 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return -1;
    }
    if (strcmp(how, "dlopen") == 0) {
#define X(name, ret, args) *(void **)&a->name = dlsym(h, #name);
        API_LIST(X)
#undef X
        return 0;
    }
    int ptsz = strcmp(how, "procaddr_ptsz") == 0;
    if (strcmp(how, "procaddr_v2") == 0 || ptsz) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
        *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
        if (!gpa) return -1;
        char buf[128];
        CUdriverProcAddressQueryResult st;
        cuuint64_t fl = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#define X(name, ret, args)                                                                      \
    if (gpa(base_name(#name, buf, sizeof buf), (void **)&a->name, 12040, fl, &st) != 0) {       \
        fprintf(stderr, "cuGetProcAddress_v2(%s) failed\n", buf);                                \
        return -1;                                                                              \
    }
        API_LIST(X)
#undef X
        return 0;
    }
    if (strcmp(how, "procaddr") == 0) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t);
        *(void **)&gpa = dlsym(h, "cuGetProcAddress");
        if (!gpa) return -1;
        char buf[128];
#define X(name, ret, args)                                                                      \
    if (gpa(base_name(#name, buf, sizeof buf), (void **)&a->name, 12040, 0) != 0) {            \
        fprintf(stderr, "cuGetProcAddress(%s) failed\n", buf);                                   \
        return -1;                                                                              \
    }
        API_LIST(X)
#undef X
        return 0;
    }
    fprintf(stderr, "unknown loader %s\n", how);
    return -1;
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
