/* A fake libnvidia-ml.so.1 backed by the same shared fake GPU as the fake libcuda.so.1. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include "../../../native/include/gpuops_cuda.h"

#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static struct fg_state *S;

struct nvmlDevice_st { int index; };
static struct nvmlDevice_st g_devs[FG_MAX_DEV];

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    S = fg_attach();
    if (!S) return NVML_ERROR_UNKNOWN;
    for (int i = 0; i < FG_MAX_DEV; i++) g_devs[i].index = i;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return S ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED; }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "Error"; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = S->ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= S->ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_devs[i];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned len) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || !buf) return NVML_ERROR_INVALID_ARGUMENT;
    const uint8_t *u = S->dev[d->index].uuid;
    char tmp[64];
    snprintf(tmp, sizeof tmp,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    if (strlen(tmp) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, tmp, strlen(tmp) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    struct fg_dev *x = &S->dev[d->index];
    uint64_t used = atomic_load(&x->used_mem);
    m->total = x->total_mem;
    m->used = used;
    m->free = used > x->total_mem ? 0 : x->total_mem - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
    struct fg_dev *x = &S->dev[d->index];
    uint64_t used = atomic_load(&x->used_mem);
    m->total = x->total_mem;
    m->reserved = 0;
    m->used = used;
    m->free = used > x->total_mem ? 0 : x->total_mem - used;
    return NVML_SUCCESS;
}
