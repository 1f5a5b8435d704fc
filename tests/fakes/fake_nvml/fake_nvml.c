/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU.
 *
 * It exports the NVML entry points gpuops' NVML backend uses (through pynvml's ctypes calls),
 * with the ABI of nvml.h: the structures below are declared here, field for field, because the
 * NVIDIA headers are not needed to build this file.  Sizes are checked with _Static_assert
 * against the version words pynvml passes (e.g. nvmlMemory_v2 = 2 << 24 | 40).
 *
 * At nvmlInit the library reads the file named by $FAKE_NVML_CONFIG: a line format written by
 * tests/fakes/nvml_fake.py (see README.md next to this file).  The state (MIG mode, GPU and
 * compute instances) then lives in this process and MIG control calls change it.
 *
 * Semantics copied from NVML (nvml.h and NVIDIA's MIG user guide):
 *   - every call before nvmlInit (or after the last nvmlShutdown) returns UNINITIALIZED;
 *   - process lists use the count in/out protocol: too small -> INSUFFICIENT_SIZE + needed count;
 *   - utilization rates are NOT_SUPPORTED on a MIG-enabled GPU and on MIG device handles;
 *   - nvmlDeviceGetMigMode is NOT_SUPPORTED on a GPU without MIG;
 *   - nvmlDeviceGetAttributes_v2 only supports MIG device handles (unless the config gives the
 *     parent GPU an sm_count, as some drivers answer for full GPUs too);
 *   - creating an instance that does not fit -> INSUFFICIENT_RESOURCES; destroying one that has
 *     processes (or, for a GPU instance, compute instances) -> IN_USE;
 *   - a lost GPU (config "lost") fails nvmlDeviceGetHandleByIndex with GPU_IS_LOST.
 * Error injection: "error <function> <code>" makes that function return <code> (globally, or for
 * one device's handle); "mig_error" does the same for the MIG device handles of a device.
 * Missing functions are not handled here: the Python helper links a variant with a version
 * script that hides them, so dlsym fails and pynvml raises FUNCTION_NOT_FOUND.
 *
 * GPM (nvmlGpm*): Hopper-style per-GPU-instance counters.  A sample records the time and the
 * SM-busy time accumulated at the instance's configured SM utilization ("gi ... <sm util>"), so
 * nvmlGpmMetricsGet computes SM_UTIL from two samples as the driver does: busy time over elapsed
 * time.  "gpm 0" (the default below Hopper, architecture < 9) makes nvmlGpmQueryDeviceSupport say
 * isSupportedDevice = 0 and the sampling calls NOT_SUPPORTED.
 *
 * Events (nvmlEventSet*): "event <ms> <type> <data> <gi> <ci>" lines make a device raise an event
 * <ms> after nvmlInit; an event set registered for that type on that device before then delivers
 * it once from nvmlEventSetWait_v2 (NVML records no event from before registration).
 *
 * Thread safety: the tests call the device functions from one thread; the event functions may be
 * called from another (as the agent's health thread does), and take their own lock.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h types (ABI-compatible declarations) ---------------------------------------- */

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFu /* gpuInstanceId / computeInstanceId without MIG */
#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_CLOCK_VIDEO 3
#define NVML_TEMPERATURE_GPU 0

typedef struct fake_handle *nvmlDevice_t;
typedef struct fake_handle *nvmlGpuInstance_t;
typedef struct fake_handle *nvmlComputeInstance_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* nvmlProcessInfo_v2_t == nvmlProcessInfo_v3_t (pynvml uses the same layout for both). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)
#define nvmlGpuInstanceProfileInfo_v2 NVML_STRUCT_VERSION(sizeof(nvmlGpuInstanceProfileInfo_v2_t), 2)
#define nvmlComputeInstanceProfileInfo_v2 NVML_STRUCT_VERSION(sizeof(nvmlComputeInstanceProfileInfo_v2_t), 2)

/* The version words pynvml hard-codes; a layout mistake here would break them. */
_Static_assert(sizeof(nvmlMemory_v2_t) == 0x28, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_v2_t) == 0x98, "nvmlGpuInstanceProfileInfo_v2_t layout");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_v2_t) == 0x88, "nvmlComputeInstanceProfileInfo_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_v3_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "nvmlGpuInstanceInfo_t layout");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32, "nvmlComputeInstanceInfo_t layout");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t layout");

/* ---- the fake's state ------------------------------------------------------------------- */

#define MAX_DEVICES 16
#define MAX_ERRORS 32
#define MAX_GIP 24
#define MAX_GI 16
#define MAX_CI 64
#define MAX_PROCS 128
#define MAX_PLACEMENTS 8
#define MAX_CI_ENUMS 9
#define NAME_LEN 96

enum { MAGIC_DEV = 0x44455631, MAGIC_GI = 0x47494e31, MAGIC_CI = 0x43494e31, MAGIC_MIG = 0x4d494731 };

struct fake_handle {
    unsigned int magic;
};

typedef struct {
    char fn[64];
    int code;
} injected_error_t;

typedef struct {
    unsigned int enm;   /* NVML_COMPUTE_INSTANCE_PROFILE_*; also the profile's info.id */
    unsigned int slices; /* compute slices */
    unsigned int count;  /* how many fit in the GPU instance */
    unsigned int sms;
    unsigned int n_placements;
    unsigned int placements[MAX_PLACEMENTS]; /* compute-slice starts, in the driver's order */
} ci_profile_t;

typedef struct {
    unsigned int enm; /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;  /* info.id */
    unsigned int slices;      /* compute slices ("g") */
    unsigned int mem_slices;  /* placement size */
    unsigned int instance_count;
    unsigned int sms;
    unsigned int ce, dec, enc, jpeg, ofa;
    unsigned long long mem_mb;
    unsigned int n_ci;
    ci_profile_t cip[MAX_CI_ENUMS];
    unsigned int n_placements;
    unsigned int placements[MAX_PLACEMENTS]; /* starts, in the driver's preferred order */
    char name[NAME_LEN];
} gi_profile_t;

struct device;
struct gpu_instance;

typedef struct compute_instance {
    struct fake_handle h; /* MAGIC_CI while it exists */
    struct fake_handle mig; /* MAGIC_MIG: the MIG device handle of this compute instance */
    struct device *dev;
    struct gpu_instance *gi;
    unsigned int id;
    unsigned int enm;
    unsigned int start;
    unsigned int size;
    char uuid[NAME_LEN];
} compute_instance_t;

typedef struct gpu_instance {
    struct fake_handle h; /* MAGIC_GI while it exists */
    struct device *dev;
    unsigned int id;
    const gi_profile_t *profile;
    unsigned int start;
    unsigned long long mem_used;
    double sm_util; /* percent of its SMs busy (GPM) */
} gpu_instance_t;

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi;
    unsigned int ci;
    int compute;
    int graphics;
} fake_process_t;

typedef struct device {
    struct fake_handle h; /* MAGIC_DEV */
    unsigned int index;
    char name[NAME_LEN];
    char uuid[NAME_LEN];
    char bus_id[32];
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    unsigned long long mem_total, mem_used, mem_reserved;
    unsigned int util_gpu, util_mem;
    unsigned int power_mw, power_limit_mw;
    unsigned int temperature;
    unsigned int sm_clock, mem_clock;
    int sm_count; /* -1: attributes on the parent handle are NOT_SUPPORTED */
    unsigned int architecture;
    int lost;
    int mig_capable, mig_current, mig_pending, mig_needs_reset;
    unsigned int max_mig_devices, mig_mem_slices, mig_compute_slices;
    injected_error_t errors[MAX_ERRORS];
    int n_errors;
    injected_error_t mig_errors[MAX_ERRORS];
    int n_mig_errors;
    gi_profile_t gip[MAX_GIP];
    int n_gip;
    gpu_instance_t gi[MAX_GI];
    compute_instance_t ci[MAX_CI];
    fake_process_t procs[MAX_PROCS];
    int n_procs;
    int gpm_supported;
    unsigned long long events_supported; /* nvmlDeviceGetSupportedEventTypes */
} device_t;

#define MAX_EVENTS 64

typedef struct {
    unsigned int dev;
    double due; /* monotonic seconds */
    unsigned long long type;
    unsigned long long data;
    unsigned int gi, ci;
} fake_event_t;

static struct {
    int init_count;
    int loaded;
    char driver_version[80];
    char nvml_version[80];
    int cuda_driver_version;
    int init_error;
    injected_error_t errors[MAX_ERRORS];
    int n_errors;
    device_t dev[MAX_DEVICES];
    int n_dev;
    double init_time; /* monotonic seconds at the init that read the config */
    fake_event_t events[MAX_EVENTS];
    int n_events;
} g;


/* ---- helpers ----------------------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int find_error(const injected_error_t *list, int n, const char *fn) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].fn, fn) == 0) return list[i].code;
    return 0;
}

static int global_error(const char *fn) { return find_error(g.errors, g.n_errors, fn); }

static device_t *as_device(nvmlDevice_t h) {
    if (h == NULL || h->magic != MAGIC_DEV) return NULL;
    return (device_t *)h;
}

static compute_instance_t *as_mig(nvmlDevice_t h) {
    if (h == NULL || h->magic != MAGIC_MIG) return NULL;
    return (compute_instance_t *)((char *)h - offsetof(compute_instance_t, mig));
}

static gpu_instance_t *as_gi(nvmlGpuInstance_t h) {
    if (h == NULL || h->magic != MAGIC_GI) return NULL;
    return (gpu_instance_t *)h;
}

static compute_instance_t *as_ci(nvmlComputeInstance_t h) {
    if (h == NULL || h->magic != MAGIC_CI) return NULL;
    return (compute_instance_t *)h;
}

/* Resolve a device or MIG device handle; returns an NVML code (0 when usable). */
static int resolve(nvmlDevice_t h, const char *fn, device_t **dev, compute_instance_t **mig) {
    if (!g.init_count) return NVML_ERROR_UNINITIALIZED;
    int err = global_error(fn);
    if (err) return err;
    *mig = as_mig(h);
    if (*mig) {
        *dev = (*mig)->dev;
        return find_error((*dev)->mig_errors, (*dev)->n_mig_errors, fn);
    }
    *dev = as_device(h);
    if (*dev == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((*dev)->lost) return NVML_ERROR_GPU_IS_LOST;
    return find_error((*dev)->errors, (*dev)->n_errors, fn);
}

/* For functions that only take a full-GPU handle. */
static int resolve_device(nvmlDevice_t h, const char *fn, device_t **dev) {
    compute_instance_t *mig = NULL;
    int err = resolve(h, fn, dev, &mig);
    if (err) return err;
    if (mig) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static int resolve_gi(nvmlGpuInstance_t h, const char *fn, gpu_instance_t **gi) {
    if (!g.init_count) return NVML_ERROR_UNINITIALIZED;
    int err = global_error(fn);
    if (err) return err;
    *gi = as_gi(h);
    if (*gi == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((*gi)->dev->lost) return NVML_ERROR_GPU_IS_LOST;
    return find_error((*gi)->dev->errors, (*gi)->dev->n_errors, fn);
}

static int resolve_ci(nvmlComputeInstance_t h, const char *fn, compute_instance_t **ci) {
    if (!g.init_count) return NVML_ERROR_UNINITIALIZED;
    int err = global_error(fn);
    if (err) return err;
    *ci = as_ci(h);
    if (*ci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((*ci)->dev->lost) return NVML_ERROR_GPU_IS_LOST;
    return find_error((*ci)->dev->errors, (*ci)->dev->n_errors, fn);
}

static const gi_profile_t *profile_by_id(const device_t *d, unsigned int id) {
    for (int i = 0; i < d->n_gip; i++)
        if (d->gip[i].id == id) return &d->gip[i];
    return NULL;
}

static const gi_profile_t *profile_by_enum(const device_t *d, unsigned int enm) {
    for (int i = 0; i < d->n_gip; i++)
        if (d->gip[i].enm == enm) return &d->gip[i];
    return NULL;
}

static gpu_instance_t *gi_by_id(device_t *d, unsigned int id) {
    for (int i = 0; i < MAX_GI; i++)
        if (d->gi[i].h.magic == MAGIC_GI && d->gi[i].id == id) return &d->gi[i];
    return NULL;
}

static const ci_profile_t *ci_profile(const gi_profile_t *p, unsigned int enm) {
    for (unsigned int i = 0; i < p->n_ci; i++)
        if (p->cip[i].enm == enm) return &p->cip[i];
    return NULL;
}

static int gi_has_processes(const device_t *d, unsigned int gi_id) {
    for (int i = 0; i < d->n_procs; i++)
        if (d->procs[i].gi == gi_id) return 1;
    return 0;
}

static int ci_has_processes(const device_t *d, unsigned int gi_id, unsigned int ci_id) {
    for (int i = 0; i < d->n_procs; i++)
        if (d->procs[i].gi == gi_id && d->procs[i].ci == ci_id) return 1;
    return 0;
}

static int gi_has_cis(const device_t *d, const gpu_instance_t *gi) {
    for (int i = 0; i < MAX_CI; i++)
        if (d->ci[i].h.magic == MAGIC_CI && d->ci[i].gi == gi) return 1;
    return 0;
}

static void make_mig_uuid(char *out, size_t cap, const device_t *d, unsigned int gi, unsigned int ci) {
    snprintf(out, cap, "MIG-fa4e0000-%04x-%04x-%04x-%012x", d->index, gi, ci, 0xc0ffeeu);
}

/* Can a GPU instance of profile p sit at `start`?  Checks placement list, memory-slice overlap
 * and the GPU's total compute slices. */
static int gi_fits(const device_t *d, const gi_profile_t *p, unsigned int start) {
    int valid = 0;
    for (unsigned int i = 0; i < p->n_placements; i++)
        if (p->placements[i] == start) valid = 1;
    if (!valid) return 0;
    unsigned int used_compute = 0;
    for (int i = 0; i < MAX_GI; i++) {
        const gpu_instance_t *o = &d->gi[i];
        if (o->h.magic != MAGIC_GI) continue;
        used_compute += o->profile->slices;
        unsigned int os = o->start, oe = o->start + o->profile->mem_slices;
        if (start < oe && os < start + p->mem_slices) return 0;
    }
    return used_compute + p->slices <= d->mig_compute_slices;
}

static unsigned int gi_count(const device_t *d, const gi_profile_t *p) {
    unsigned int n = 0;
    for (int i = 0; i < MAX_GI; i++)
        if (d->gi[i].h.magic == MAGIC_GI && d->gi[i].profile == p) n++;
    return n;
}

static int ci_fits(const device_t *d, const gpu_instance_t *gi, const ci_profile_t *cp, unsigned int start) {
    int valid = 0;
    for (unsigned int i = 0; i < cp->n_placements; i++)
        if (cp->placements[i] == start) valid = 1;
    if (!valid) return 0;
    unsigned int size = cp->slices;
    for (int i = 0; i < MAX_CI; i++) {
        const compute_instance_t *o = &d->ci[i];
        if (o->h.magic != MAGIC_CI || o->gi != gi) continue;
        if (start < o->start + o->size && o->start < start + size) return 0;
    }
    return 1;
}


static unsigned int ci_count(const device_t *d, const gpu_instance_t *gi, unsigned int enm) {
    unsigned int n = 0;
    for (int i = 0; i < MAX_CI; i++)
        if (d->ci[i].h.magic == MAGIC_CI && d->ci[i].gi == gi && d->ci[i].enm == enm) n++;
    return n;
}

static gpu_instance_t *add_gi(device_t *d, const gi_profile_t *p, unsigned int id, unsigned int start,
                              unsigned long long mem_used) {
    for (int i = 0; i < MAX_GI; i++) {
        gpu_instance_t *gi = &d->gi[i];
        if (gi->h.magic == MAGIC_GI) continue;
        gi->h.magic = MAGIC_GI;
        gi->dev = d;
        gi->id = id;
        gi->profile = p;
        gi->start = start;
        gi->mem_used = mem_used;
        gi->sm_util = 0.0;
        return gi;
    }
    return NULL;
}

static compute_instance_t *add_ci(device_t *d, gpu_instance_t *gi, unsigned int id, const ci_profile_t *cp,
                                  unsigned int start, const char *uuid) {
    for (int i = 0; i < MAX_CI; i++) {
        compute_instance_t *ci = &d->ci[i];
        if (ci->h.magic == MAGIC_CI) continue;
        ci->h.magic = MAGIC_CI;
        ci->mig.magic = MAGIC_MIG;
        ci->dev = d;
        ci->gi = gi;
        ci->id = id;
        ci->enm = cp->enm;
        ci->start = start;
        ci->size = cp->slices;
        if (uuid && *uuid && strcmp(uuid, "-") != 0)
            copy_str(ci->uuid, sizeof ci->uuid, uuid);
        else
            make_mig_uuid(ci->uuid, sizeof ci->uuid, d, gi->id, id);
        return ci;
    }
    return NULL;
}

/* MIG devices (one per compute instance), ordered by (GPU instance id, compute instance id). */
static int mig_devices(device_t *d, compute_instance_t **out, int cap) {
    int n = 0;
    for (int i = 0; i < MAX_CI && n < cap; i++)
        if (d->ci[i].h.magic == MAGIC_CI) out[n++] = &d->ci[i];
    for (int i = 1; i < n; i++) {
        compute_instance_t *x = out[i];
        int j = i - 1;
        while (j >= 0 && (out[j]->gi->id > x->gi->id || (out[j]->gi->id == x->gi->id && out[j]->id > x->id))) {
            out[j + 1] = out[j];
            j--;
        }
        out[j + 1] = x;
    }
    return n;
}

/* ---- configuration ----------------------------------------------------------------------- */

static char *rest_after(char *line, int tokens) {
    /* Skip `tokens` whitespace-separated tokens and the blanks after them. */
    char *p = line;
    for (int t = 0; t < tokens; t++) {
        while (*p == ' ' || *p == '\t') p++;
        while (*p && *p != ' ' && *p != '\t') p++;
    }
    while (*p == ' ' || *p == '\t') p++;
    return p;
}

static unsigned int parse_list(const char *s, unsigned int *out, unsigned int cap) {
    unsigned int n = 0;
    if (strcmp(s, "-") == 0) return 0;
    while (*s && n < cap) {
        char *end;
        out[n++] = (unsigned int)strtoul(s, &end, 0);
        if (*end != ',') break;
        s = end + 1;
    }
    return n;
}

static int add_error(injected_error_t *list, int *n, const char *fn, int code) {
    if (*n >= MAX_ERRORS) return -1;
    copy_str(list[*n].fn, sizeof list[*n].fn, fn);
    list[*n].code = code;
    (*n)++;
    return 0;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int load_config(void) {
    g.init_time = now_seconds();
    g.n_events = 0;
    memset(&g.errors, 0, sizeof g.errors);
    g.n_errors = 0;
    g.n_dev = 0;
    g.init_error = 0;
    memset(g.dev, 0, sizeof g.dev);
    copy_str(g.driver_version, sizeof g.driver_version, "999.99.99");
    copy_str(g.nvml_version, sizeof g.nvml_version, "12.999.99.99");
    g.cuda_driver_version = 12040;

    const char *path = getenv("FAKE_NVML_CONFIG");
    if (path == NULL || *path == '\0') return 0; /* no GPUs */
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fake_nvml: cannot open FAKE_NVML_CONFIG=%s\n", path);
        return -1;
    }
    char line[1024];
    int lineno = 0;
    device_t *d = NULL;
    int bad = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        char key[64] = "";
        if (sscanf(line, " %63s", key) != 1 || key[0] == '#') continue;
        char *rest = rest_after(line, 1);
        char fn[64];
        int code;
        if (strcmp(key, "driver_version") == 0) {
            copy_str(g.driver_version, sizeof g.driver_version, rest);
        } else if (strcmp(key, "nvml_version") == 0) {
            copy_str(g.nvml_version, sizeof g.nvml_version, rest);
        } else if (strcmp(key, "cuda_driver_version") == 0) {
            g.cuda_driver_version = atoi(rest);
        } else if (strcmp(key, "init_error") == 0) {
            g.init_error = atoi(rest);
        } else if (strcmp(key, "error") == 0 || strcmp(key, "mig_error") == 0) {
            if (sscanf(rest, "%63s %d", fn, &code) != 2) goto bad_line;
            int r;
            if (d == NULL && key[0] == 'e')
                r = add_error(g.errors, &g.n_errors, fn, code);
            else if (d == NULL)
                goto bad_line;
            else if (key[0] == 'e')
                r = add_error(d->errors, &d->n_errors, fn, code);
            else
                r = add_error(d->mig_errors, &d->n_mig_errors, fn, code);
            if (r) goto bad_line;
        } else if (strcmp(key, "device") == 0) {
            if (g.n_dev >= MAX_DEVICES) goto bad_line;
            d = &g.dev[g.n_dev];
            d->h.magic = MAGIC_DEV;
            d->index = (unsigned int)g.n_dev;
            d->sm_count = -1;
            d->max_mig_devices = 7;
            d->mig_mem_slices = 8;
            d->mig_compute_slices = 7;
            d->events_supported = 0x0F; /* ECC single/double, PState, XID: an Ampere/Hopper board */
            g.n_dev++;
        } else if (d == NULL) {
            goto bad_line;
        } else if (strcmp(key, "name") == 0) {
            copy_str(d->name, sizeof d->name, rest);
        } else if (strcmp(key, "uuid") == 0) {
            copy_str(d->uuid, sizeof d->uuid, rest);
        } else if (strcmp(key, "bus_id") == 0) {
            copy_str(d->bus_id, sizeof d->bus_id, rest);
        } else if (strcmp(key, "pci") == 0) {
            char devid[32], subsys[32];
            if (sscanf(rest, "%31s %31s", devid, subsys) != 2) goto bad_line;
            d->pci_device_id = (unsigned int)strtoul(devid, NULL, 0);
            d->pci_subsystem_id = (unsigned int)strtoul(subsys, NULL, 0);
        } else if (strcmp(key, "memory") == 0) {
            if (sscanf(rest, "%llu %llu %llu", &d->mem_total, &d->mem_used, &d->mem_reserved) != 3) goto bad_line;
        } else if (strcmp(key, "utilization") == 0) {
            if (sscanf(rest, "%u %u", &d->util_gpu, &d->util_mem) != 2) goto bad_line;
        } else if (strcmp(key, "power") == 0) {
            if (sscanf(rest, "%u %u", &d->power_mw, &d->power_limit_mw) != 2) goto bad_line;
        } else if (strcmp(key, "temperature") == 0) {
            d->temperature = (unsigned int)atoi(rest);
        } else if (strcmp(key, "clocks") == 0) {
            if (sscanf(rest, "%u %u", &d->sm_clock, &d->mem_clock) != 2) goto bad_line;
        } else if (strcmp(key, "sm_count") == 0) {
            d->sm_count = atoi(rest);
        } else if (strcmp(key, "architecture") == 0) {
            d->architecture = (unsigned int)atoi(rest);
        } else if (strcmp(key, "lost") == 0) {
            d->lost = atoi(rest);
        } else if (strcmp(key, "mig") == 0) {
            /* mig <current> <pending> <needs_reset> <max_mig_devices> <mem_slices> <compute_slices> */
            if (sscanf(rest, "%d %d %d %u %u %u", &d->mig_current, &d->mig_pending, &d->mig_needs_reset,
                       &d->max_mig_devices, &d->mig_mem_slices, &d->mig_compute_slices) != 6)
                goto bad_line;
            d->mig_capable = 1;
        } else if (strcmp(key, "gip") == 0) {
            /* gip enum id slices mem_slices count sms ce dec enc jpeg ofa mem_mb placements name */
            if (d->n_gip >= MAX_GIP) goto bad_line;
            gi_profile_t *p = &d->gip[d->n_gip];
            char pls[128];
            if (sscanf(rest, "%u %u %u %u %u %u %u %u %u %u %u %llu %127s", &p->enm, &p->id, &p->slices,
                       &p->mem_slices, &p->instance_count, &p->sms, &p->ce, &p->dec, &p->enc, &p->jpeg, &p->ofa,
                       &p->mem_mb, pls) != 13)
                goto bad_line;
            if (p->slices == 0 || p->mem_slices == 0) goto bad_line;
            p->n_placements = parse_list(pls, p->placements, MAX_PLACEMENTS);
            copy_str(p->name, sizeof p->name, rest_after(rest, 13));
            d->n_gip++;
        } else if (strcmp(key, "cip") == 0) {
            /* cip enum slices count sms placements: a compute profile of the last gip */
            if (d->n_gip == 0) goto bad_line;
            gi_profile_t *p = &d->gip[d->n_gip - 1];
            if (p->n_ci >= MAX_CI_ENUMS) goto bad_line;
            ci_profile_t *cp = &p->cip[p->n_ci];
            char pls[128];
            if (sscanf(rest, "%u %u %u %u %127s", &cp->enm, &cp->slices, &cp->count, &cp->sms, pls) != 5)
                goto bad_line;
            if (cp->enm >= MAX_CI_ENUMS || cp->slices == 0) goto bad_line;
            cp->n_placements = parse_list(pls, cp->placements, MAX_PLACEMENTS);
            p->n_ci++;
        } else if (strcmp(key, "gi") == 0) {
            /* gi id profile_id start mem_used [sm_util percent] */
            unsigned int id, pid, start;
            unsigned long long used;
            double sm_util = 0.0;
            int n = sscanf(rest, "%u %u %u %llu %lf", &id, &pid, &start, &used, &sm_util);
            if (n != 4 && n != 5) goto bad_line;
            const gi_profile_t *p = profile_by_id(d, pid);
            gpu_instance_t *gi = NULL;
            if (p == NULL || gi_by_id(d, id) || !(gi = add_gi(d, p, id, start, used))) goto bad_line;
            gi->sm_util = sm_util;
        } else if (strcmp(key, "gpm") == 0) {
            d->gpm_supported = atoi(rest);
        } else if (strcmp(key, "events_supported") == 0) {
            d->events_supported = strtoull(rest, NULL, 0);
        } else if (strcmp(key, "event") == 0) {
            /* event ms type data gi ci */
            unsigned int ms, gi, ci;
            unsigned long long type, data;
            if (g.n_events >= MAX_EVENTS) goto bad_line;
            if (sscanf(rest, "%u %llu %llu %u %u", &ms, &type, &data, &gi, &ci) != 5) goto bad_line;
            fake_event_t *e = &g.events[g.n_events++];
            e->dev = d->index;
            e->due = g.init_time + ms / 1000.0;
            e->type = type;
            e->data = data;
            e->gi = gi;
            e->ci = ci;
        } else if (strcmp(key, "ci") == 0) {
            /* ci gi_id id enum start uuid */
            unsigned int gid, id, enm, start;
            char uuid[NAME_LEN];
            if (sscanf(rest, "%u %u %u %u %95s", &gid, &id, &enm, &start, uuid) != 5) goto bad_line;
            gpu_instance_t *gi = gi_by_id(d, gid);
            const ci_profile_t *cp = gi ? ci_profile(gi->profile, enm) : NULL;
            if (cp == NULL || !add_ci(d, gi, id, cp, start, uuid)) goto bad_line;
        } else if (strcmp(key, "proc") == 0) {
            /* proc pid used gi ci types(c|g|cg) */
            if (d->n_procs >= MAX_PROCS) goto bad_line;
            fake_process_t *pr = &d->procs[d->n_procs];
            char types[8];
            if (sscanf(rest, "%u %llu %u %u %7s", &pr->pid, &pr->used, &pr->gi, &pr->ci, types) != 5) goto bad_line;
            pr->compute = strchr(types, 'c') != NULL;
            pr->graphics = strchr(types, 'g') != NULL;
            d->n_procs++;
        } else {
            goto bad_line;
        }
        continue;
    bad_line:
        fprintf(stderr, "fake_nvml: %s:%d: bad line: %s\n", path, lineno, line);
        bad = 1;
    }
    fclose(f);
    return bad ? -1 : 0;
}

/* ---- init, shutdown, errors -------------------------------------------------------------- */

static nvmlReturn_t do_init(const char *fn) {
    if (g.init_count == 0) {
        if (load_config() != 0) return NVML_ERROR_UNKNOWN;
        if (g.init_error) return g.init_error;
    }
    int err = global_error(fn);
    if (err) return err;
    g.init_count++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(__func__); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(__func__); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init(__func__);
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (g.init_count == 0) return NVML_ERROR_UNINITIALIZED;
    g.init_count--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system ------------------------------------------------------------------------------ */

#define CHECK_INIT()                                       \
    do {                                                   \
        if (!g.init_count) return NVML_ERROR_UNINITIALIZED; \
        int e_ = global_error(__func__);                   \
        if (e_) return e_;                                 \
    } while (0)

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    if (buf == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    CHECK_INIT();
    return put_str(version, length, g.driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    CHECK_INIT();
    return put_str(version, length, g.nvml_version);
}

static nvmlReturn_t cuda_version(int *v) {
    if (v == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *v = g.cuda_driver_version;
    return NVML_SUCCESS;
}

/* The CUDA version works without nvmlInit in real NVML (it asks libcuda); the fake needs init. */
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    CHECK_INIT();
    return cuda_version(v);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    CHECK_INIT();
    return cuda_version(v);
}

static nvmlReturn_t device_count(unsigned int *count) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)g.n_dev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    CHECK_INIT();
    return device_count(count);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    CHECK_INIT();
    return device_count(count);
}

static nvmlReturn_t handle_by_index(const char *fn, unsigned int index, nvmlDevice_t *device) {
    if (device == NULL || index >= (unsigned int)g.n_dev) return NVML_ERROR_INVALID_ARGUMENT;
    device_t *d = &g.dev[index];
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    int err = find_error(d->errors, d->n_errors, fn);
    if (err) return err;
    *device = &d->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    CHECK_INIT();
    return handle_by_index(__func__, index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    CHECK_INIT();
    return handle_by_index(__func__, index, device);
}

/* ---- device identity --------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (mig) {
        char buf[2 * NAME_LEN];
        snprintf(buf, sizeof buf, "%s MIG %s", d->name, mig->gi->profile->name);
        return put_str(name, length, buf);
    }
    return put_str(name, length, d->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    return put_str(uuid, length, mig ? mig->uuid : d->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(d->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_subsystem_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain & 0xffff, bus, dev, fn);
    copy_str(pci->busId, sizeof pci->busId, d->bus_id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t h, unsigned int *arch) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (arch == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *arch = d->architecture ? d->architecture : 0xffffffffu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t h, nvmlDeviceAttributes_t *attr) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (attr == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(attr, 0, sizeof *attr);
    if (mig) {
        const gi_profile_t *p = mig->gi->profile;
        const ci_profile_t *cp = ci_profile(p, mig->enm);
        attr->multiprocessorCount = cp ? cp->sms : p->sms;
        attr->sharedCopyEngineCount = p->ce;
        attr->sharedDecoderCount = p->dec;
        attr->sharedEncoderCount = p->enc;
        attr->sharedJpegCount = p->jpeg;
        attr->sharedOfaCount = p->ofa;
        attr->gpuInstanceSliceCount = p->slices;
        attr->computeInstanceSliceCount = mig->size;
        attr->memorySizeMB = p->mem_mb;
        return NVML_SUCCESS;
    }
    if (d->sm_count < 0) return NVML_ERROR_NOT_SUPPORTED; /* "only supports MIG device handles" */
    attr->multiprocessorCount = (unsigned int)d->sm_count;
    attr->memorySizeMB = d->mem_total >> 20;
    return NVML_SUCCESS;
}

/* ---- device readings --------------------------------------------------------------------- */

static void mig_memory(const compute_instance_t *mig, unsigned long long *total, unsigned long long *used) {
    *total = mig->gi->profile->mem_mb << 20;
    *used = mig->gi->mem_used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *mem) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (mem == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (mig) {
        mig_memory(mig, &mem->total, &mem->used);
    } else {
        mem->total = d->mem_total;
        mem->used = d->mem_used + d->mem_reserved; /* v1 counts reserved memory as used */
    }
    mem->free = mem->total > mem->used ? mem->total - mem->used : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *mem) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (mem == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (mig) {
        mig_memory(mig, &mem->total, &mem->used);
        mem->reserved = 0;
    } else {
        mem->total = d->mem_total;
        mem->used = d->mem_used;
        mem->reserved = d->mem_reserved;
    }
    unsigned long long taken = mem->used + mem->reserved;
    mem->free = mem->total > taken ? mem->total - taken : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *util) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (util == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (mig || d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    util->gpu = d->util_gpu;
    util->memory = d->util_mem;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (mw == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = d->power_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (mw == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = d->power_limit_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t h, unsigned int *mw) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (mw == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = d->power_limit_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *temp) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (temp == NULL || sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temperature;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (mhz == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *mhz = d->sm_clock; return NVML_SUCCESS;
    case NVML_CLOCK_MEM: *mhz = d->mem_clock; return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO: return NVML_ERROR_NOT_SUPPORTED;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* Count in/out protocol of nvmlDeviceGet{Compute,Graphics}RunningProcesses. */
static nvmlReturn_t list_processes(device_t *d, compute_instance_t *mig, int graphics, unsigned int *count,
                                   nvmlProcessInfo_t *infos) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    const fake_process_t *sel[MAX_PROCS];
    for (int i = 0; i < d->n_procs; i++) {
        const fake_process_t *p = &d->procs[i];
        if (!(graphics ? p->graphics : p->compute)) continue;
        if (mig && (p->gi != mig->gi->id || p->ci != mig->id)) continue;
        sel[n++] = p;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = sel[i]->pid;
        infos[i].usedGpuMemory = sel[i]->used;
        infos[i].gpuInstanceId = sel[i]->gi;
        infos[i].computeInstanceId = sel[i]->ci;
    }
    *count = n;
    return NVML_SUCCESS;
}

#define PROCESS_LIST_FN(NAME, GRAPHICS)                                                       \
    EXPORT nvmlReturn_t NAME(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos) { \
        device_t *d;                                                                          \
        compute_instance_t *mig;                                                              \
        int err = resolve(h, __func__, &d, &mig);                                             \
        if (err) return err;                                                                  \
        return list_processes(d, mig, GRAPHICS, count, infos);                                \
    }

PROCESS_LIST_FN(nvmlDeviceGetComputeRunningProcesses_v3, 0)
PROCESS_LIST_FN(nvmlDeviceGetComputeRunningProcesses_v2, 0)
PROCESS_LIST_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, 1)
PROCESS_LIST_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, 1)

/* ---- MIG mode and MIG device handles ----------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)d->mig_current;
    *pending = (unsigned int)d->mig_pending;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t h, unsigned int mode, nvmlReturn_t *activation) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (activation == NULL || mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    int busy = d->n_procs > 0;
    if (!mode) {
        for (int i = 0; i < MAX_GI; i++)
            if (d->gi[i].h.magic == MAGIC_GI) busy = 1;
    }
    if (busy && (unsigned int)d->mig_current != mode) {
        *activation = NVML_ERROR_IN_USE;
        return NVML_ERROR_IN_USE;
    }
    d->mig_pending = (int)mode;
    if (!d->mig_needs_reset) d->mig_current = (int)mode; /* Hopper: no reset needed */
    *activation = NVML_SUCCESS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned int *count) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (d->mig_capable && d->mig_current) ? d->max_mig_devices : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int index, nvmlDevice_t *out) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= d->max_mig_devices) return NVML_ERROR_INVALID_ARGUMENT;
    compute_instance_t *list[MAX_CI];
    int n = mig_devices(d, list, MAX_CI);
    if ((int)index >= n) return NVML_ERROR_NOT_FOUND;
    *out = &list[index]->mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned int *is_mig) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (is_mig == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = mig != NULL;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t h, unsigned int *id) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = mig->gi->id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t h, unsigned int *id) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (id == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = mig->id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t h, nvmlDevice_t *out) {
    device_t *d;
    compute_instance_t *mig;
    int err = resolve(h, __func__, &d, &mig);
    if (err) return err;
    if (out == NULL || !mig) return NVML_ERROR_INVALID_ARGUMENT;
    *out = &d->h;
    return NVML_SUCCESS;
}

/* ---- GPU instance profiles and GPU instances --------------------------------------------- */

static void fill_gip_v1(nvmlGpuInstanceProfileInfo_t *info, const gi_profile_t *p) {
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instance_count;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->mem_mb;
}

static nvmlReturn_t find_gip(device_t *d, unsigned int enm, const gi_profile_t **p) {
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (enm >= 0x12) return NVML_ERROR_INVALID_ARGUMENT;
    *p = profile_by_enum(d, enm);
    return *p ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t h, unsigned int enm,
                                                        nvmlGpuInstanceProfileInfo_t *info) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const gi_profile_t *p;
    err = find_gip(d, enm, &p);
    if (err) return err;
    fill_gip_v1(info, p);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t h, unsigned int enm,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const gi_profile_t *p;
    err = find_gip(d, enm, &p);
    if (err) return err;
    nvmlGpuInstanceProfileInfo_t v1;
    fill_gip_v1(&v1, p);
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    copy_str(info->name, sizeof info->name, p->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t h, unsigned int profile_id,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    const gi_profile_t *p = profile_by_id(d, profile_id);
    if (p == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (placements == NULL) {
        *count = p->n_placements;
        return NVML_SUCCESS;
    }
    /* Report placements in increasing start order, as nvidia-smi mig -lgipp shows them. */
    unsigned int starts[MAX_PLACEMENTS];
    memcpy(starts, p->placements, sizeof starts);
    for (unsigned int i = 1; i < p->n_placements; i++)
        for (unsigned int j = i; j > 0 && starts[j - 1] > starts[j]; j--) {
            unsigned int t = starts[j];
            starts[j] = starts[j - 1];
            starts[j - 1] = t;
        }
    for (unsigned int i = 0; i < p->n_placements; i++) {
        placements[i].start = starts[i];
        placements[i].size = p->mem_slices;
    }
    *count = p->n_placements;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t h, unsigned int profile_id,
                                                              unsigned int *count) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    const gi_profile_t *p = profile_by_id(d, profile_id);
    if (p == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* Greedily count how many more fit (all placements of a profile have the same size). */
    gpu_instance_t *added[MAX_PLACEMENTS];
    unsigned int n = 0, existing = gi_count(d, p);
    for (unsigned int i = 0; i < p->n_placements && existing + n < p->instance_count; i++) {
        if (!gi_fits(d, p, p->placements[i])) continue;
        added[n] = add_gi(d, p, 0xFFFFu, p->placements[i], 0);
        if (added[n] == NULL) break;
        n++;
    }
    for (unsigned int i = 0; i < n; i++) added[i]->h.magic = 0;
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(device_t *d, unsigned int profile_id, const unsigned int *start,
                              nvmlGpuInstance_t *out) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    const gi_profile_t *p = profile_by_id(d, profile_id);
    if (p == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (start) {
        int valid = 0;
        for (unsigned int i = 0; i < p->n_placements; i++)
            if (p->placements[i] == *start) valid = 1;
        if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (gi_count(d, p) >= p->instance_count) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int found = 0;
    unsigned int at = 0;
    if (start) {
        found = gi_fits(d, p, *start);
        at = *start;
    } else {
        for (unsigned int i = 0; i < p->n_placements && !found; i++)
            if (gi_fits(d, p, p->placements[i])) {
                found = 1;
                at = p->placements[i];
            }
    }
    if (!found) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    /* GI ids as observed on A100: 7g -> 0, 4g/3g at 0/4 -> 1/2, 2g at 0/2/4 -> 3/4/5, 1g at n -> 7+n. */
    unsigned int id = d->mig_mem_slices / p->mem_slices - 1 + at / p->mem_slices;
    if (gi_by_id(d, id)) {
        id = 0;
        while (gi_by_id(d, id)) id++;
    }
    gpu_instance_t *gi = add_gi(d, p, id, at, 0);
    if (gi == NULL) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *out = &gi->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t h, unsigned int profile_id, nvmlGpuInstance_t *out) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    return create_gi(d, profile_id, NULL, out);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t h, unsigned int profile_id,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *out) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (placement == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    const gi_profile_t *p = profile_by_id(d, profile_id);
    if (p != NULL && placement->size != p->mem_slices) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, profile_id, &placement->start, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t h, unsigned int profile_id, nvmlGpuInstance_t *instances,
                                              unsigned int *count) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (count == NULL || instances == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    const gi_profile_t *p = profile_by_id(d, profile_id);
    if (p == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* The buffer must hold the profile's instanceCount entries; count is output only. */
    unsigned int n = 0;
    for (int i = 0; i < MAX_GI && n < p->instance_count; i++)
        if (d->gi[i].h.magic == MAGIC_GI && d->gi[i].profile == p) instances[n++] = &d->gi[i].h;
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t h, unsigned int id, nvmlGpuInstance_t *out) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    gpu_instance_t *gi = gi_by_id(d, id);
    if (gi == NULL) return NVML_ERROR_NOT_FOUND;
    *out = &gi->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info) {
    gpu_instance_t *gi;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &gi->dev->h;
    info->id = gi->id;
    info->profileId = gi->profile->id;
    info->placement.start = gi->start;
    info->placement.size = gi->profile->mem_slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t h) {
    gpu_instance_t *gi;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (gi_has_cis(gi->dev, gi) || gi_has_processes(gi->dev, gi->id)) return NVML_ERROR_IN_USE;
    gi->h.magic = 0;
    return NVML_SUCCESS;
}

/* ---- compute instances ------------------------------------------------------------------- */

static nvmlReturn_t find_cip(gpu_instance_t *gi, unsigned int enm, unsigned int eng, const ci_profile_t **cp) {
    if (enm >= 0x9 || eng != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *cp = ci_profile(gi->profile, enm);
    return *cp ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static void fill_cip_v1(nvmlComputeInstanceProfileInfo_t *info, const gpu_instance_t *gi, const ci_profile_t *cp) {
    const gi_profile_t *p = gi->profile;
    info->id = cp->enm; /* compute instance profile ids equal the enum values */
    info->sliceCount = cp->slices;
    info->instanceCount = cp->count;
    info->multiprocessorCount = cp->sms;
    info->sharedCopyEngineCount = p->ce;
    info->sharedDecoderCount = p->dec;
    info->sharedEncoderCount = p->enc;
    info->sharedJpegCount = p->jpeg;
    info->sharedOfaCount = p->ofa;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t h, unsigned int enm,
                                                                 unsigned int eng,
                                                                 nvmlComputeInstanceProfileInfo_t *info) {
    gpu_instance_t *gi;
    const ci_profile_t *cp;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    err = find_cip(gi, enm, eng, &cp);
    if (err) return err;
    fill_cip_v1(info, gi, cp);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t h, unsigned int enm,
                                                                  unsigned int eng,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info) {
    gpu_instance_t *gi;
    const ci_profile_t *cp;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    err = find_cip(gi, enm, eng, &cp);
    if (err) return err;
    nvmlComputeInstanceProfileInfo_t v1;
    fill_cip_v1(&v1, gi, cp);
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->sharedCopyEngineCount = v1.sharedCopyEngineCount;
    info->sharedDecoderCount = v1.sharedDecoderCount;
    info->sharedEncoderCount = v1.sharedEncoderCount;
    info->sharedJpegCount = v1.sharedJpegCount;
    info->sharedOfaCount = v1.sharedOfaCount;
    const char *gname = gi->profile->name;
    if (strncmp(gname, "MIG ", 4) == 0) gname += 4;
    if (v1.sliceCount == gi->profile->slices)
        snprintf(info->name, sizeof info->name, "MIG %.80s", gname);
    else
        snprintf(info->name, sizeof info->name, "MIG %uc.%.80s", v1.sliceCount, gname);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t h, unsigned int profile_id,
                                                                       unsigned int *count) {
    gpu_instance_t *gi;
    const ci_profile_t *cp;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    err = find_cip(gi, profile_id, 0, &cp);
    if (err) return err;
    unsigned int n = 0, have = ci_count(gi->dev, gi, profile_id);
    compute_instance_t *added[MAX_PLACEMENTS];
    for (unsigned int i = 0; i < cp->n_placements && have + n < cp->count; i++) {
        if (!ci_fits(gi->dev, gi, cp, cp->placements[i])) continue;
        added[n] = add_ci(gi->dev, gi, 0xFFFFu, cp, cp->placements[i], "-");
        if (added[n] == NULL) break;
        n++;
    }
    for (unsigned int i = 0; i < n; i++) added[i]->h.magic = added[i]->mig.magic = 0;
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t h, unsigned int profile_id,
                                                                        nvmlComputeInstancePlacement_t *placements,
                                                                        unsigned int *count) {
    gpu_instance_t *gi;
    const ci_profile_t *cp;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    err = find_cip(gi, profile_id, 0, &cp);
    if (err) return err;
    if (placements) {
        for (unsigned int i = 0; i < cp->n_placements; i++) {
            placements[i].start = cp->placements[i];
            placements[i].size = cp->slices;
        }
    }
    *count = cp->n_placements;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(gpu_instance_t *gi, unsigned int profile_id, const nvmlComputeInstancePlacement_t *pl,
                              nvmlComputeInstance_t *out) {
    const ci_profile_t *cp;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    int err = find_cip(gi, profile_id, 0, &cp);
    if (err) return err;
    device_t *d = gi->dev;
    if (pl) {
        int valid = pl->size == cp->slices;
        int listed = 0;
        for (unsigned int i = 0; i < cp->n_placements; i++)
            if (cp->placements[i] == pl->start) listed = 1;
        if (!valid || !listed) return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (ci_count(d, gi, profile_id) >= cp->count) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int found = 0;
    unsigned int at = 0;
    if (pl) {
        found = ci_fits(d, gi, cp, pl->start);
        at = pl->start;
    } else {
        for (unsigned int i = 0; i < cp->n_placements && !found; i++)
            if (ci_fits(d, gi, cp, cp->placements[i])) {
                found = 1;
                at = cp->placements[i];
            }
    }
    if (!found) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned int id = 0;
    for (;;) {
        int taken = 0;
        for (int i = 0; i < MAX_CI; i++)
            if (d->ci[i].h.magic == MAGIC_CI && d->ci[i].gi == gi && d->ci[i].id == id) taken = 1;
        if (!taken) break;
        id++;
    }
    compute_instance_t *ci = add_ci(d, gi, id, cp, at, NULL);
    if (ci == NULL) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    *out = &ci->h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t h, unsigned int profile_id,
                                                         nvmlComputeInstance_t *out) {
    gpu_instance_t *gi;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    return create_ci(gi, profile_id, NULL, out);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t h, unsigned int profile_id, const nvmlComputeInstancePlacement_t *placement,
    nvmlComputeInstance_t *out) {
    gpu_instance_t *gi;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (placement == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gi, profile_id, placement, out);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t h, unsigned int profile_id,
                                                       nvmlComputeInstance_t *instances, unsigned int *count) {
    gpu_instance_t *gi;
    const ci_profile_t *cp;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (count == NULL || instances == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    err = find_cip(gi, profile_id, 0, &cp);
    if (err) return err;
    /* The buffer must hold the profile's instanceCount entries; count is output only. */
    unsigned int n = 0;
    for (int i = 0; i < MAX_CI && n < cp->count; i++) {
        compute_instance_t *ci = &gi->dev->ci[i];
        if (ci->h.magic == MAGIC_CI && ci->gi == gi && ci->enm == profile_id) instances[n++] = &ci->h;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t h, unsigned int id,
                                                          nvmlComputeInstance_t *out) {
    gpu_instance_t *gi;
    int err = resolve_gi(h, __func__, &gi);
    if (err) return err;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_CI; i++) {
        compute_instance_t *ci = &gi->dev->ci[i];
        if (ci->h.magic == MAGIC_CI && ci->gi == gi && ci->id == id) {
            *out = &ci->h;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t h, const char *fn, nvmlComputeInstanceInfo_t *info) {
    compute_instance_t *ci;
    int err = resolve_ci(h, fn, &ci);
    if (err) return err;
    if (info == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &ci->dev->h;
    info->gpuInstance = &ci->gi->h;
    info->id = ci->id;
    info->profileId = ci->enm;
    info->placement.start = ci->start;
    info->placement.size = ci->size;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info) {
    return ci_info(h, __func__, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info) {
    return ci_info(h, __func__, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t h) {
    compute_instance_t *ci;
    int err = resolve_ci(h, __func__, &ci);
    if (err) return err;
    if (ci_has_processes(ci->dev, ci->gi->id, ci->id)) return NVML_ERROR_IN_USE;
    ci->h.magic = 0;
    ci->mig.magic = 0;
    return NVML_SUCCESS;
}

/* ---- GPM ----------------------------------------------------------------------------------- */

#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3
#define NVML_GPM_METRIC_MAX 210 /* nvml.h of CUDA 12.9; pynvml's array may be longer */
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1
#define MAGIC_GPM 0x47504d31

typedef struct nvmlGpmSample_st {
    unsigned int magic;
    const device_t *dev;
    int filled;
    int mig;             /* a GPU instance's sample (nvmlGpmMigSampleGet) */
    unsigned int gi;
    double time;         /* monotonic seconds when taken */
    double busy;         /* SM-busy seconds accumulated until then */
} *nvmlGpmSample_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t layout");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t layout");

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t h, nvmlGpmSupport_t *support) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (support == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = d->gpm_supported ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *out) {
    CHECK_INIT();
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpmSample_t sample = calloc(1, sizeof *sample);
    if (sample == NULL) return NVML_ERROR_MEMORY;
    sample->magic = MAGIC_GPM;
    *out = sample;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    CHECK_INIT();
    if (sample == NULL || sample->magic != MAGIC_GPM) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

static void gpm_fill(nvmlGpmSample_t sample, const device_t *d, int mig, unsigned int gi, double util) {
    double t = now_seconds();
    sample->dev = d;
    sample->mig = mig;
    sample->gi = gi;
    sample->time = t;
    sample->busy = util / 100.0 * (t - g.init_time); /* busy at a steady rate since init */
    sample->filled = 1;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t h, nvmlGpmSample_t sample) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (sample == NULL || sample->magic != MAGIC_GPM) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->gpm_supported) return NVML_ERROR_NOT_SUPPORTED;
    double util = d->util_gpu;
    if (d->mig_current) { /* the whole GPU: its instances' busy SMs over all of its SMs */
        util = 0.0;
        for (int i = 0; i < MAX_GI; i++)
            if (d->gi[i].h.magic == MAGIC_GI)
                util += d->gi[i].sm_util * d->gi[i].profile->slices / d->mig_compute_slices;
    }
    gpm_fill(sample, d, 0, 0, util);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t h, unsigned int gpu_instance_id, nvmlGpmSample_t sample) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (sample == NULL || sample->magic != MAGIC_GPM) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->gpm_supported || !d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (!d->mig_current) return NVML_ERROR_INVALID_ARGUMENT;
    gpu_instance_t *gi = gi_by_id(d, gpu_instance_id);
    if (gi == NULL) return NVML_ERROR_NOT_FOUND;
    gpm_fill(sample, d, 1, gpu_instance_id, gi->sm_util);
    return NVML_SUCCESS;
}

static char sm_util_short[] = "sm_util", sm_util_long[] = "SM utilization", percent_unit[] = "%";
static char occ_short[] = "sm_occupancy", occ_long[] = "SM occupancy";

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    CHECK_INIT();
    if (request == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (request->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t a = request->sample1, b = request->sample2;
    if (request->numMetrics > NVML_GPM_METRIC_MAX || a == NULL || b == NULL || a->magic != MAGIC_GPM ||
        b->magic != MAGIC_GPM || !a->filled || !b->filled)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Two samples of one counter set: the same GPU, or the same GPU instance of it. */
    if (a->dev != b->dev || a->mig != b->mig || a->gi != b->gi) return NVML_ERROR_INVALID_ARGUMENT;
    double elapsed = b->time - a->time;
    for (unsigned int i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *m = &request->metrics[i];
        m->value = 0.0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        if (elapsed <= 0.0) {
            m->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; /* sample2 must come after sample1 */
            continue;
        }
        double util = (b->busy - a->busy) / elapsed * 100.0;
        if (util > 100.0) util = 100.0;
        if (util < 0.0) util = 0.0;
        m->metricInfo.unit = percent_unit;
        if (m->metricId == NVML_GPM_METRIC_SM_UTIL) {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = util;
            m->metricInfo.shortName = sm_util_short;
            m->metricInfo.longName = sm_util_long;
        } else if (m->metricId == NVML_GPM_METRIC_SM_OCCUPANCY) {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = util / 2.0; /* half the warps of a busy SM: a plausible figure */
            m->metricInfo.shortName = occ_short;
            m->metricInfo.longName = occ_long;
        } else {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            m->metricInfo.unit = NULL;
        }
    }
    return NVML_SUCCESS;
}

/* ---- events -------------------------------------------------------------------------------- */

#define MAGIC_SET 0x45565331

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");

typedef struct nvmlEventSet_st {
    unsigned int magic;
    unsigned long long types[MAX_DEVICES]; /* registered types per device */
    double since[MAX_DEVICES];             /* when each device was registered */
    unsigned char delivered[MAX_EVENTS];
} *nvmlEventSet_t;

static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *out) {
    CHECK_INIT();
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventSet_t set = calloc(1, sizeof *set);
    if (set == NULL) return NVML_ERROR_MEMORY;
    set->magic = MAGIC_SET;
    *out = set;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (types == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *types = d->events_supported;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set) {
    device_t *d;
    int err = resolve_device(h, __func__, &d);
    if (err) return err;
    if (set == NULL || set->magic != MAGIC_SET) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~d->events_supported) return NVML_ERROR_NOT_SUPPORTED; /* none registered then */
    pthread_mutex_lock(&event_lock);
    if (!set->types[d->index]) set->since[d->index] = now_seconds();
    set->types[d->index] |= types;
    pthread_mutex_unlock(&event_lock);
    return NVML_SUCCESS;
}

/* The next event `set` should deliver now (index), or -1; *next gets the due time of the next
 * one still to come (0 when none). */
static int next_event(nvmlEventSet_t set, double now, double *next) {
    int found = -1;
    *next = 0.0;
    for (int i = 0; i < g.n_events; i++) {
        const fake_event_t *e = &g.events[i];
        if (set->delivered[i] || !(set->types[e->dev] & e->type) || e->due < set->since[e->dev]) continue;
        if (e->due <= now) {
            if (found < 0 || e->due < g.events[found].due) found = i;
        } else if (*next == 0.0 || e->due < *next) {
            *next = e->due;
        }
    }
    return found;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    CHECK_INIT();
    if (set == NULL || set->magic != MAGIC_SET || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = now_seconds() + timeoutms / 1000.0;
    for (;;) {
        double now = now_seconds(), next;
        pthread_mutex_lock(&event_lock);
        int i = next_event(set, now, &next);
        if (i >= 0) {
            const fake_event_t *e = &g.events[i];
            set->delivered[i] = 1;
            data->device = &g.dev[e->dev].h;
            data->eventType = e->type;
            data->eventData = e->data;
            data->gpuInstanceId = e->gi;
            data->computeInstanceId = e->ci;
        }
        pthread_mutex_unlock(&event_lock);
        if (i >= 0) return NVML_SUCCESS;
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        double until = (next > 0.0 && next < deadline) ? next : deadline;
        double pause = until - now;
        if (pause > 0.05) pause = 0.05; /* short naps: a registration meanwhile is seen soon */
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    CHECK_INIT();
    if (set == NULL || set->magic != MAGIC_SET) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    free(set);
    return NVML_SUCCESS;
}

/* ---- test controls (not NVML) ------------------------------------------------------------ */

/* Make GPU `index` fall off the bus (lost=1) or come back (lost=0) while the process runs. */
EXPORT int fake_nvml_set_lost(unsigned int index, int lost) {
    if (index >= (unsigned int)g.n_dev) return NVML_ERROR_INVALID_ARGUMENT;
    g.dev[index].lost = lost;
    return NVML_SUCCESS;
}
