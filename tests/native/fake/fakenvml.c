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
    /* the card's whole memory; v1's "used" includes what the driver reserves */
    m->total = x->total_mem + x->reserved_mem;
    m->used = used + x->reserved_mem;
    m->free = used > x->total_mem ? 0 : x->total_mem - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
    struct fg_dev *x = &S->dev[d->index];
    uint64_t used = atomic_load(&x->used_mem);
    m->total = x->total_mem + x->reserved_mem;
    m->reserved = x->reserved_mem;
    m->used = used;
    m->free = used > x->total_mem ? 0 : x->total_mem - used;
    return NVML_SUCCESS;
}

/* The processes with a context on the device, and the device memory each holds (contexts
 * included): what the real one lists, host pids (the fake's processes share one namespace). */
static nvmlReturn_t running(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *infos) {
    if (!S) return NVML_ERROR_UNINITIALIZED;
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0, room = infos ? *count : 0;
    int dead = 0;
    for (int i = 0; i < FG_MAX_PROCS; i++) {
        struct fg_proc *p = &S->procs[i];
        int pid = atomic_load(&p->pid);
        if (pid <= 0) continue;
        uint64_t mem = atomic_load(&p->mem[d->index]);
        if (!atomic_load(&p->ctxs[d->index]) && !mem) continue;
        if (!fg_proc_alive(p)) { /* dead (its pid maybe reused): it holds nothing */
            dead = 1;
            continue;
        }
        if (n < room) infos[n] = (nvmlProcessInfo_t){(unsigned)pid, mem, 0xFFFFFFFFu, 0xFFFFFFFFu};
        n++;
    }
    if (dead) fg_sweep_dead(S); /* the driver frees what dead processes held */
    *count = n;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *infos) {
    return running(d, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *infos) {
    return running(d, count, infos);
}
