/*
 * interposer: a program that wraps cuMemAlloc_v2 itself and reaches the next definition with
 * dlsym(RTLD_NEXT), as profilers and other interposers do.  The limiter's dlsym must answer
 * RTLD_NEXT relative to this program, so that the chain goes program -> limiter -> driver.
 *   interposer SIZE...   prints "alloc <rc>" per size, then "wrapped <calls>"
 */
#define _GNU_SOURCE
#include "gpuops_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static int calls;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    static CUresult (*next)(CUdeviceptr *, size_t);
    if (!next) *(void **)&next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    calls++;
    return next(p, size);
}

extern CUresult cuInit(unsigned);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);

int main(int argc, char **argv) {
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) return 1;
    for (int i = 1; i < argc; i++) {
        CUdeviceptr p;
        printf("alloc %d\n", cuMemAlloc_v2(&p, strtoull(argv[i], NULL, 0)));
    }
    printf("wrapped %d\n", calls);
    return 0;
}
