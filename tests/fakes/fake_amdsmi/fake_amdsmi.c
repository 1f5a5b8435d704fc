/* A fake libamd_smi.so: the calls gpuops' AMD backend makes, as AMD's amdsmi.h documents them
 * (ROCm 7.0, the ABI of the amdsmi 7.0.2 Python binding), over GPUs described by a text file.
 *
 * The node is read at amdsmi_init from $FAKE_AMDSMI_CONFIG (format in README.md). Every other
 * symbol the binding binds at import is made by tests/fakes/amdsmi_fake.py as an alias of
 * fake_not_supported: a library whose hardware lacks a feature answers NOT_SUPPORTED.
 * librocm-core.so's getROCmVersion lives here too; the tests install this file under both names.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

/* amdsmi_status_t values (amdsmi.h) */
enum {
    ST_SUCCESS = 0,
    ST_INVAL = 1,
    ST_NOT_SUPPORTED = 2,
    ST_NO_PERM = 10,
    ST_OUT_OF_RESOURCES = 15,
    ST_INPUT_OUT_OF_BOUNDS = 17,
    ST_INIT_ERROR = 18,
    ST_BUSY = 30,
    ST_NOT_FOUND = 31,
    ST_NOT_INIT = 32,
    ST_DRIVER_NOT_LOADED = 34,
    ST_INSUFFICIENT_SIZE = 41,
    ST_ARG_PTR_NULL = 53,
    ST_AMDGPU_RESTART_ERR = 54,
    ST_SETTING_UNAVAILABLE = 55,
};

#define AMDSMI_INIT_AMD_GPUS 2u
#define MAX_GPUS 16
#define MAX_PROCS 32
#define MAX_FAILS 16

/* The structures the backend reads, field for field as in amdsmi.h (ROCm 7.0). */
typedef struct {
    char market_name[256];
    uint32_t vendor_id;
    char vendor_name[256];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[256];
    uint32_t oam_id;
    uint32_t num_of_compute_units;
    uint64_t target_graphics_version;
    uint32_t subsystem_id;
    uint32_t reserved[21];
} asic_info_t;

typedef struct {
    char driver_version[256];
    char driver_date[256];
    char driver_name[256];
} driver_info_t;

typedef struct {
    uint64_t socket_power;
    uint32_t current_socket_power;
    uint32_t average_socket_power;
    uint64_t gfx_voltage;
    uint64_t soc_voltage;
    uint64_t mem_voltage;
    uint32_t power_limit;
    uint64_t reserved[18];
} power_info_t;

typedef struct {
    uint32_t clk;
    uint32_t min_clk;
    uint32_t max_clk;
    uint8_t clk_locked;
    uint8_t clk_deep_sleep;
    uint32_t reserved[4];
} clk_info_t;

typedef struct {
    uint32_t gfx_activity;
    uint32_t umc_activity;
    uint32_t mm_activity;
    uint32_t reserved[13];
} engine_usage_t;

typedef struct {
    char name[256];
    uint32_t pid;
    uint64_t mem;
    struct {
        uint64_t gfx;
        uint64_t enc;
        uint32_t reserved[12];
    } engine_usage;
    struct {
        uint64_t gtt_mem;
        uint64_t cpu_mem;
        uint64_t vram_mem;
        uint32_t reserved[10];
    } memory_usage;
    char container_name[256];
    uint32_t cu_occupancy;
    uint32_t reserved[11];
} proc_info_t;

typedef struct {
    char name[256];
    uint32_t pid;
    uint64_t vram;
} proc_t;

typedef struct {
    char function[64];
    uint32_t status;
} fail_t;

typedef struct {
    int present;
    char market_name[256];
    char serial[256];
    char uuid[64];
    uint64_t device_id;
    uint32_t vendor_id;
    uint32_t rev_id;
    uint32_t compute_units;
    uint64_t gfx_version;
    uint64_t bdf;
    uint64_t vram_total;
    uint64_t vram_used;
    uint32_t gfx_activity, umc_activity, mm_activity;
    uint32_t power_w;
    int64_t temp_edge, temp_hotspot;
    uint32_t sclk, mclk;
    char compute_partition[8]; /* "" when the GPU has none: NOT_SUPPORTED */
    char memory_partition[8];
    char compute_modes[64];   /* space-separated modes a set accepts */
    char memory_modes[64];
    proc_t procs[MAX_PROCS];
    int nprocs;
    fail_t fails[MAX_FAILS];
    int nfails;
} gpu_t;

static gpu_t gpus[MAX_GPUS];
static int ngpus;
static int initialised;
static char driver_version[256];

static const struct {
    const char *name;
    uint32_t code;
} status_names[] = {
    {"INVAL", ST_INVAL}, {"NOT_SUPPORTED", ST_NOT_SUPPORTED}, {"NO_PERM", ST_NO_PERM},
    {"OUT_OF_RESOURCES", ST_OUT_OF_RESOURCES}, {"BUSY", ST_BUSY}, {"NOT_FOUND", ST_NOT_FOUND},
    {"DRIVER_NOT_LOADED", ST_DRIVER_NOT_LOADED}, {"AMDGPU_RESTART_ERR", ST_AMDGPU_RESTART_ERR},
    {"SETTING_UNAVAILABLE", ST_SETTING_UNAVAILABLE}, {"INIT_ERROR", ST_INIT_ERROR},
};

static uint32_t status_code(const char *name) {
    for (size_t i = 0; i < sizeof(status_names) / sizeof(status_names[0]); i++)
        if (strcmp(status_names[i].name, name) == 0) return status_names[i].code;
    return (uint32_t)strtoul(name, NULL, 0);
}

static void copy(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

/* One line: `N.key value...` for GPU N, or `key value` for the node. */
static int parse_line(char *line, uint32_t *init_status) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (!line[0] || line[0] == '#') return 0;
    char *value = strchr(line, ' ');
    if (value) *value++ = 0; else value = line + strlen(line);
    if (strcmp(line, "driver_version") == 0) { copy(driver_version, sizeof driver_version, value); return 0; }
    if (strcmp(line, "rocm_version") == 0) return 0; /* getROCmVersion's */
    if (strcmp(line, "init_status") == 0) { *init_status = status_code(value); return 0; }
    char *dot = strchr(line, '.');
    if (!dot) return -1;
    *dot = 0;
    int index = atoi(line);
    const char *key = dot + 1;
    if (index < 0 || index >= MAX_GPUS) return -1;
    gpu_t *g = &gpus[index];
    if (!g->present) { g->present = 1; if (index + 1 > ngpus) ngpus = index + 1; }
    if (strcmp(key, "market_name") == 0) copy(g->market_name, sizeof g->market_name, value);
    else if (strcmp(key, "serial") == 0) copy(g->serial, sizeof g->serial, value);
    else if (strcmp(key, "uuid") == 0) copy(g->uuid, sizeof g->uuid, value);
    else if (strcmp(key, "device_id") == 0) g->device_id = strtoull(value, NULL, 0);
    else if (strcmp(key, "vendor_id") == 0) g->vendor_id = (uint32_t)strtoul(value, NULL, 0);
    else if (strcmp(key, "rev_id") == 0) g->rev_id = (uint32_t)strtoul(value, NULL, 0);
    else if (strcmp(key, "compute_units") == 0) g->compute_units = (uint32_t)strtoul(value, NULL, 0);
    else if (strcmp(key, "gfx_version") == 0) g->gfx_version = strtoull(value, NULL, 0);
    else if (strcmp(key, "bdf") == 0) {
        unsigned dom, bus, dev, fn;
        if (sscanf(value, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return -1;
        g->bdf = (uint64_t)(fn & 7) | ((uint64_t)(dev & 31) << 3) | ((uint64_t)(bus & 255) << 8) |
                 ((uint64_t)dom << 16);
    } else if (strcmp(key, "vram_total") == 0) g->vram_total = strtoull(value, NULL, 0);
    else if (strcmp(key, "vram_used") == 0) g->vram_used = strtoull(value, NULL, 0);
    else if (strcmp(key, "activity") == 0) {
        if (sscanf(value, "%u %u %u", &g->gfx_activity, &g->umc_activity, &g->mm_activity) != 3) return -1;
    } else if (strcmp(key, "power") == 0) {
        if (sscanf(value, "%u", &g->power_w) != 1) return -1;
    } else if (strcmp(key, "temperature") == 0) {
        long long edge, hot;
        if (sscanf(value, "%lld %lld", &edge, &hot) != 2) return -1;
        g->temp_edge = edge; g->temp_hotspot = hot;
    } else if (strcmp(key, "clocks") == 0) {
        if (sscanf(value, "%u %u", &g->sclk, &g->mclk) != 2) return -1;
    } else if (strcmp(key, "compute_partition") == 0) copy(g->compute_partition, sizeof g->compute_partition, value);
    else if (strcmp(key, "memory_partition") == 0) copy(g->memory_partition, sizeof g->memory_partition, value);
    else if (strcmp(key, "compute_modes") == 0) copy(g->compute_modes, sizeof g->compute_modes, value);
    else if (strcmp(key, "memory_modes") == 0) copy(g->memory_modes, sizeof g->memory_modes, value);
    else if (strcmp(key, "proc") == 0) {
        if (g->nprocs == MAX_PROCS) return -1;
        proc_t *p = &g->procs[g->nprocs];
        int used = 0;
        unsigned long long vram;
        if (sscanf(value, "%u %llu %n", &p->pid, &vram, &used) < 2) return -1;
        p->vram = vram;
        copy(p->name, sizeof p->name, value + used);
        g->nprocs++;
    } else if (strcmp(key, "fail") == 0) {
        if (g->nfails == MAX_FAILS) return -1;
        char fn[64], st[64];
        if (sscanf(value, "%63s %63s", fn, st) != 2) return -1;
        copy(g->fails[g->nfails].function, sizeof g->fails[0].function, fn);
        g->fails[g->nfails].status = status_code(st);
        g->nfails++;
    } else return -1;
    return 0;
}

/* The status a test made `function` fail with on this GPU, 0 when it works. */
static uint32_t injected(const gpu_t *g, const char *function) {
    for (int i = 0; i < g->nfails; i++)
        if (strcmp(g->fails[i].function, function) == 0) return g->fails[i].status;
    return 0;
}

/* The GPU of a handle, after the checks every call makes; a status to return when they fail. */
#define GPU(handle)                                                           \
    if (!initialised) return ST_NOT_INIT;                                     \
    gpu_t *g = (gpu_t *)(handle);                                             \
    if (g < gpus || g >= gpus + ngpus || !g->present) return ST_INVAL;        \
    {                                                                         \
        uint32_t fail = injected(g, __func__);                                \
        if (fail) return fail;                                                \
    }

#define GPU_OR_FAIL(handle, out)                                              \
    GPU(handle)                                                               \
    if ((out) == NULL) return ST_INVAL;

API uint32_t fake_not_supported(void) { return ST_NOT_SUPPORTED; }

API uint32_t amdsmi_init(uint64_t flags) {
    if (!(flags & AMDSMI_INIT_AMD_GPUS)) return ST_SUCCESS; /* nothing asked that we have */
    const char *path = getenv("FAKE_AMDSMI_CONFIG");
    if (!path) return ST_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f) return ST_DRIVER_NOT_LOADED;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    uint32_t init_status = 0;
    char line[1024];
    int bad = 0;
    while (fgets(line, sizeof line, f))
        if (parse_line(line, &init_status) != 0) bad = 1;
    fclose(f);
    /* Partition modes outlive the process, as the driver's do: the last ones set are kept in
     * $FAKE_AMDSMI_STATE (when given), in the same format, over the node file's. */
    const char *state = getenv("FAKE_AMDSMI_STATE");
    FILE *kept = state ? fopen(state, "r") : NULL;
    if (kept) {
        while (fgets(line, sizeof line, kept))
            if (parse_line(line, &init_status) != 0) bad = 1;
        fclose(kept);
    }
    if (bad) return ST_INIT_ERROR;
    if (init_status) return init_status;
    initialised = 1;
    return ST_SUCCESS;
}

/* Write every GPU's partition modes to $FAKE_AMDSMI_STATE (a new file renamed over the old). */
static void keep_modes(void) {
    const char *state = getenv("FAKE_AMDSMI_STATE");
    if (!state) return;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", state) >= (int)sizeof tmp) return;
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < ngpus; i++)
        if (gpus[i].present && gpus[i].compute_partition[0])
            fprintf(f, "%d.compute_partition %s\n%d.memory_partition %s\n", i, gpus[i].compute_partition, i,
                    gpus[i].memory_partition);
    if (fclose(f) == 0) rename(tmp, state);
}

API uint32_t amdsmi_shut_down(void) {
    initialised = 0;
    return ST_SUCCESS;
}

/* One socket per GPU, as an MI300X OAM module is one package. */
API uint32_t amdsmi_get_socket_handles(uint32_t *count, void **handles) {
    if (!initialised) return ST_NOT_INIT;
    if (!count) return ST_INVAL;
    uint32_t n = 0;
    for (int i = 0; i < ngpus; i++) {
        if (!gpus[i].present) continue;
        if (handles && n < *count) handles[n] = &gpus[i];
        n++;
    }
    *count = n;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_processor_handles(void *socket, uint32_t *count, void **handles) {
    if (!initialised) return ST_NOT_INIT;
    gpu_t *g = (gpu_t *)socket;
    if (!count || g < gpus || g >= gpus + ngpus) return ST_INVAL;
    if (handles && *count >= 1) handles[0] = g;
    *count = 1;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_device_bdf(void *handle, uint64_t *bdf) {
    GPU_OR_FAIL(handle, bdf);
    *bdf = g->bdf;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_device_uuid(void *handle, uint32_t *len, char *uuid) {
    GPU_OR_FAIL(handle, len);
    if (!uuid) return ST_INVAL;
    size_t need = strlen(g->uuid) + 1;
    if (*len < need) { *len = (uint32_t)need; return ST_INSUFFICIENT_SIZE; }
    memcpy(uuid, g->uuid, need);
    *len = (uint32_t)need;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_asic_info(void *handle, asic_info_t *info) {
    GPU_OR_FAIL(handle, info);
    memset(info, 0, sizeof *info);
    copy(info->market_name, sizeof info->market_name, g->market_name);
    info->vendor_id = g->vendor_id ? g->vendor_id : 0x1002;
    copy(info->vendor_name, sizeof info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    info->subvendor_id = 0x1002;
    info->device_id = g->device_id;
    info->rev_id = g->rev_id;
    copy(info->asic_serial, sizeof info->asic_serial, g->serial);
    info->oam_id = (uint32_t)(g - gpus);
    info->num_of_compute_units = g->compute_units ? g->compute_units : 0xFFFFFFFFu;
    info->target_graphics_version = g->gfx_version ? g->gfx_version : UINT64_MAX;
    info->subsystem_id = 0x74A1;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_driver_info(void *handle, driver_info_t *info) {
    GPU_OR_FAIL(handle, info);
    memset(info, 0, sizeof *info);
    copy(info->driver_version, sizeof info->driver_version, driver_version);
    copy(info->driver_name, sizeof info->driver_name, "amdgpu");
    return ST_SUCCESS;
}

/* amdsmi_memory_type_t: VRAM 0, VIS_VRAM 1, GTT 2 */
API uint32_t amdsmi_get_gpu_memory_total(void *handle, uint32_t type, uint64_t *total) {
    GPU_OR_FAIL(handle, total);
    if (type != 0) return ST_NOT_SUPPORTED;
    *total = g->vram_total;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_memory_usage(void *handle, uint32_t type, uint64_t *used) {
    GPU_OR_FAIL(handle, used);
    if (type != 0) return ST_NOT_SUPPORTED;
    *used = g->vram_used;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_activity(void *handle, engine_usage_t *usage) {
    GPU_OR_FAIL(handle, usage);
    memset(usage, 0, sizeof *usage);
    usage->gfx_activity = g->gfx_activity;
    usage->umc_activity = g->umc_activity;
    usage->mm_activity = g->mm_activity;
    return ST_SUCCESS;
}

/* MI300-class parts report current_socket_power; average_socket_power is 0xFFFF there. */
API uint32_t amdsmi_get_power_info(void *handle, power_info_t *info) {
    GPU_OR_FAIL(handle, info);
    memset(info, 0, sizeof *info);
    info->socket_power = g->power_w;
    info->current_socket_power = g->power_w;
    info->average_socket_power = 0xFFFF;
    info->power_limit = 0xFFFF; /* what the library reports where the cap cannot be read */
    return ST_SUCCESS;
}

/* amdsmi_temperature_type_t: EDGE 0, HOTSPOT/JUNCTION 1; metric CURRENT 0. Degrees C. */
API uint32_t amdsmi_get_temp_metric(void *handle, uint32_t type, uint32_t metric, int64_t *value) {
    GPU_OR_FAIL(handle, value);
    if (metric != 0) return ST_NOT_SUPPORTED;
    if (type == 0) {
        if (g->temp_edge < 0) return ST_NOT_SUPPORTED; /* MI300X has no edge sensor */
        *value = g->temp_edge;
    } else if (type == 1) *value = g->temp_hotspot;
    else return ST_NOT_SUPPORTED;
    return ST_SUCCESS;
}

/* amdsmi_clk_type_t: GFX 0, MEM 4. MHz. */
API uint32_t amdsmi_get_clock_info(void *handle, uint32_t type, clk_info_t *info) {
    GPU_OR_FAIL(handle, info);
    memset(info, 0, sizeof *info);
    if (type == 0) info->clk = g->sclk;
    else if (type == 4) info->clk = g->mclk;
    else return ST_NOT_SUPPORTED;
    info->min_clk = info->max_clk = 0xFFFFFFFFu;
    info->clk_locked = 0xFF;
    info->clk_deep_sleep = 0xFF;
    return ST_SUCCESS;
}

API uint32_t amdsmi_get_gpu_process_list(void *handle, uint32_t *max, proc_info_t *list) {
    GPU_OR_FAIL(handle, max);
    uint32_t room = *max;
    if (room && !list) return ST_INVAL;
    for (uint32_t i = 0; i < room && i < (uint32_t)g->nprocs; i++) {
        memset(&list[i], 0, sizeof list[i]);
        copy(list[i].name, sizeof list[i].name, g->procs[i].name);
        list[i].pid = g->procs[i].pid;
        list[i].mem = g->procs[i].vram;
        list[i].memory_usage.vram_mem = g->procs[i].vram;
        list[i].cu_occupancy = 0xFFFFFFFFu;
    }
    *max = (uint32_t)g->nprocs;
    return room && room < (uint32_t)g->nprocs ? ST_OUT_OF_RESOURCES : ST_SUCCESS;
}

static uint32_t read_mode(const char *mode, char *out, uint32_t len) {
    if (!mode[0]) return ST_NOT_SUPPORTED;
    if (!out || len == 0) return ST_INVAL;
    size_t need = strlen(mode) + 1;
    if (len < need) {
        memcpy(out, mode, len - 1);
        out[len - 1] = 0;
        return ST_INSUFFICIENT_SIZE;
    }
    memcpy(out, mode, need);
    return ST_SUCCESS;
}

static int in_list(const char *list, const char *mode) {
    size_t n = strlen(mode);
    for (const char *p = list; (p = strstr(p, mode)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return 1;
    return 0;
}

API uint32_t amdsmi_get_gpu_compute_partition(void *handle, char *out, uint32_t len) {
    GPU_OR_FAIL(handle, out);
    return read_mode(g->compute_partition, out, len);
}

API uint32_t amdsmi_get_gpu_memory_partition(void *handle, char *out, uint32_t len) {
    GPU_OR_FAIL(handle, out);
    return read_mode(g->memory_partition, out, len);
}

/* The driver refuses to repartition a GPU that has processes on it (sysfs answers EBUSY). */
API uint32_t amdsmi_set_gpu_compute_partition(void *handle, uint32_t type) {
    static const char *names[] = {"", "SPX", "DPX", "TPX", "QPX", "CPX"};
    GPU(handle)
    if (!g->compute_partition[0]) return ST_NOT_SUPPORTED;
    if (type == 0 || type > 5) return ST_INVAL;
    if (!in_list(g->compute_modes, names[type])) return ST_SETTING_UNAVAILABLE;
    if (g->nprocs) return ST_BUSY;
    copy(g->compute_partition, sizeof g->compute_partition, names[type]);
    keep_modes();
    return ST_SUCCESS;
}

API uint32_t amdsmi_set_gpu_memory_partition(void *handle, uint32_t type) {
    GPU(handle)
    if (!g->memory_partition[0]) return ST_NOT_SUPPORTED;
    const char *name = type == 1 ? "NPS1" : type == 2 ? "NPS2" : type == 4 ? "NPS4" : type == 8 ? "NPS8" : NULL;
    if (!name) return ST_INVAL;
    if (!in_list(g->memory_modes, name)) return ST_INVAL;
    if (g->nprocs) return ST_BUSY;
    copy(g->memory_partition, sizeof g->memory_partition, name);
    keep_modes();
    return ST_SUCCESS;
}

/* librocm-core.so: 0 (VerSuccess) and the node's version. Loaded as a library of its own (its
 * own copy of this file), so it reads the configuration itself rather than amdsmi_init's. */
API uint32_t getROCmVersion(uint32_t *major, uint32_t *minor, uint32_t *patch) {
    if (!major || !minor || !patch) return 1;
    const char *path = getenv("FAKE_AMDSMI_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 1;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "rocm_version %u.%u.%u", major, minor, patch) == 3;
    fclose(f);
    return found ? 0 : 1;
}

/* The sizes of the structures above, for the tests to compare with the binding's ctypes ones. */
API size_t fake_amdsmi_sizeof(const char *name) {
    if (strcmp(name, "asic_info") == 0) return sizeof(asic_info_t);
    if (strcmp(name, "driver_info") == 0) return sizeof(driver_info_t);
    if (strcmp(name, "power_info") == 0) return sizeof(power_info_t);
    if (strcmp(name, "clk_info") == 0) return sizeof(clk_info_t);
    if (strcmp(name, "engine_usage") == 0) return sizeof(engine_usage_t);
    if (strcmp(name, "proc_info") == 0) return sizeof(proc_info_t);
    return 0;
}
