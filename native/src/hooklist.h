/*
 * Every driver and NVML entry point the limiter wraps.  X(name, return, params, args)
 * generates the pointer to the real function (gl_real_<name>) and the lookup table that maps a
 * real function pointer, however the program obtained it (link, dlsym, cuGetProcAddress), to
 * the wrapper.
 */
#ifndef GPUOPS_HOOKLIST_H
#define GPUOPS_HOOKLIST_H

#include "gpuops_cuda.h"

#define GL_CUDA_HOOKS(X)                                                                               \
    X(cuInit, CUresult, (unsigned a), (a))                                                             \
    X(cuGetProcAddress, CUresult, (const char *a, void **b, int c, cuuint64_t d), (a, b, c, d))        \
    X(cuGetProcAddress_v2, CUresult,                                                                   \
      (const char *a, void **b, int c, cuuint64_t d, CUdriverProcAddressQueryResult *e), (a, b, c, d, e)) \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext * a, CUdevice b), (a, b))                         \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice a), (a))                                       \
    X(cuDevicePrimaryCtxReset_v2, CUresult, (CUdevice a), (a))                                         \
    X(cuCtxCreate_v2, CUresult, (CUcontext * a, unsigned b, CUdevice c), (a, b, c))                    \
    X(cuCtxDestroy_v2, CUresult, (CUcontext a), (a))                                                   \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr * a, size_t b), (a, b))                                    \
    X(cuMemAllocPitch_v2, CUresult, (CUdeviceptr * a, size_t *b, size_t c, size_t d, unsigned e),      \
      (a, b, c, d, e))                                                                                 \
    X(cuMemAllocManaged, CUresult, (CUdeviceptr * a, size_t b, unsigned c), (a, b, c))                 \
    X(cuMemAllocAsync, CUresult, (CUdeviceptr * a, size_t b, CUstream c), (a, b, c))                   \
    X(cuMemAllocAsync_ptsz, CUresult, (CUdeviceptr * a, size_t b, CUstream c), (a, b, c))              \
    X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr * a, size_t b, CUmemoryPool c, CUstream d),      \
      (a, b, c, d))                                                                                    \
    X(cuMemAllocFromPoolAsync_ptsz, CUresult, (CUdeviceptr * a, size_t b, CUmemoryPool c, CUstream d), \
      (a, b, c, d))                                                                                    \
    X(cuMemFree_v2, CUresult, (CUdeviceptr a), (a))                                                    \
    X(cuMemFreeAsync, CUresult, (CUdeviceptr a, CUstream b), (a, b))                                   \
    X(cuMemFreeAsync_ptsz, CUresult, (CUdeviceptr a, CUstream b), (a, b))                              \
    X(cuMemPoolCreate, CUresult, (CUmemoryPool * a, const CUmemPoolProps *b), (a, b))                  \
    X(cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool * a, CUdevice b), (a, b))                     \
    X(cuMemCreate, CUresult,                                                                           \
      (CUmemGenericAllocationHandle * a, size_t b, const CUmemAllocationProp *c, unsigned long long d), \
      (a, b, c, d))                                                                                    \
    X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle a), (a))                                   \
    X(cuArrayCreate_v2, CUresult, (CUarray * a, const CUDA_ARRAY_DESCRIPTOR *b), (a, b))               \
    X(cuArray3DCreate_v2, CUresult, (CUarray * a, const CUDA_ARRAY3D_DESCRIPTOR *b), (a, b))           \
    X(cuArrayDestroy, CUresult, (CUarray a), (a))                                                      \
    X(cuMipmappedArrayCreate, CUresult, (CUmipmappedArray * a, const CUDA_ARRAY3D_DESCRIPTOR *b, unsigned c), \
      (a, b, c))                                                                                       \
    X(cuMipmappedArrayDestroy, CUresult, (CUmipmappedArray a), (a))                                    \
    X(cuMemGetInfo_v2, CUresult, (size_t *a, size_t *b), (a, b))                                       \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *a, CUdevice b), (a, b))                                  \
    X(cuLaunchKernel, CUresult,                                                                        \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
       unsigned sm, CUstream s, void **p, void **e),                                                   \
      (f, gx, gy, gz, bx, by, bz, sm, s, p, e))                                                        \
    X(cuLaunchKernel_ptsz, CUresult,                                                                   \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
       unsigned sm, CUstream s, void **p, void **e),                                                   \
      (f, gx, gy, gz, bx, by, bz, sm, s, p, e))                                                        \
    X(cuLaunchKernelEx, CUresult, (const CUlaunchConfig *c, CUfunction f, void **p, void **e),         \
      (c, f, p, e))                                                                                    \
    X(cuLaunchKernelEx_ptsz, CUresult, (const CUlaunchConfig *c, CUfunction f, void **p, void **e),    \
      (c, f, p, e))                                                                                    \
    X(cuLaunchCooperativeKernel, CUresult,                                                             \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
       unsigned sm, CUstream s, void **p),                                                             \
      (f, gx, gy, gz, bx, by, bz, sm, s, p))                                                           \
    X(cuLaunchCooperativeKernel_ptsz, CUresult,                                                        \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
       unsigned sm, CUstream s, void **p),                                                             \
      (f, gx, gy, gz, bx, by, bz, sm, s, p))                                                           \
    X(cuGraphLaunch, CUresult, (CUgraphExec g, CUstream s), (g, s))                                    \
    X(cuGraphLaunch_ptsz, CUresult, (CUgraphExec g, CUstream s), (g, s))                              \
    X(cuCtxSynchronize, CUresult, (void), ())                                                          \
    X(cuStreamSynchronize, CUresult, (CUstream s), (s))                                                \
    X(cuStreamSynchronize_ptsz, CUresult, (CUstream s), (s))

#define GL_NVML_HOOKS(X)                                                                              \
    X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t a, nvmlMemory_t *b), (a, b))               \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t a, nvmlMemory_v2_t *b), (a, b))

#define GL_DECLARE_REAL(name, ret, params, args) extern ret(*gl_real_##name) params;
GL_CUDA_HOOKS(GL_DECLARE_REAL)
GL_NVML_HOOKS(GL_DECLARE_REAL)
#undef GL_DECLARE_REAL

#endif
