/*
 * A launch-bound loop on the driver API, for the overhead figures of tests/gpu/torchlab.py:
 * what the limiter adds to one cuLaunchKernel, without PyTorch's own ~4 us per operation and
 * its process-to-process spread around it.
 *
 *   cu_launch ITERATIONS REPEATS [CPUS [ab]]
 *
 * Loads an empty kernel from PTX (the driver compiles it; no CUDA toolkit), launches it
 * ITERATIONS times per repeat on the legacy default stream, waits for the GPU at the end of
 * each repeat, and prints 'RESULT {json}': ns per launch of each repeat, and what one event
 * record and one event query cost on this driver (the calls the limiter makes to measure GPU
 * time).  The driver is found with dlopen/dlsym, as a program that loads CUDA at run time does;
 * the limiter, when preloaded, answers dlsym with its own entry points.  CPUS (such as 14,15)
 * pins the process, and the threads the driver starts in it, before the driver starts; after
 * the warm-up the launching thread runs alone on the last of them.
 *
 * ab: the limiter's cost inside one process, free of the spread between processes (their
 * medians differ by up to 15% with or without the limiter): REPEATS pairs of blocks of
 * ITERATIONS launches, one block through the entry point dlsym gave (the limiter's, when it is
 * preloaded) and one straight into the driver's own cuLaunchKernel (looked up with glibc's
 * dlsym, which the limiter does not answer), the order turning each pair. Without the limiter
 * both are the driver's: the difference is the method's own noise.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;

static const char PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n.visible .entry empty()\n{\n\tret;\n}\n";

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(int *, int);
    CUresult (*primary_retain)(CUcontext *, int);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*ctx_sync)(void);
    CUresult (*module_load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_sync)(CUevent);
} D;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The driver's own entry point: glibc's dlsym, found with dlvsym (which the limiter leaves
 * alone), asked on the driver's handle. */
static void *driver_symbol(void *lib, const char *name) {
    void *(*sym)(void *, const char *) = NULL;
    static const char *const where[][2] = {{"libc.so.6", "GLIBC_2.34"}, {"libdl.so.2", "GLIBC_2.2.5"}};
    for (int i = 0; i < 2 && !sym; i++) {
        void *h = dlopen(where[i][0], RTLD_NOW | RTLD_NOLOAD);
        if (h) *(void **)&sym = dlvsym(h, "dlsym", where[i][1]);
    }
    return sym ? sym(lib, name) : NULL;
}

static int limiter_loaded(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "libgpuops-limiter") || strstr(line, "libvgpu.so")) found = 1;
    if (f) fclose(f);
    return found;
}

/* The launching thread alone on the last CPU of its set, the driver's threads on the others:
 * where they shared both, whole processes ran fast or slow by where the threads landed. */
static void isolate_main_thread(void) {
    cpu_set_t all, mine, rest;
    if (sched_getaffinity(0, sizeof all, &all) || CPU_COUNT(&all) < 2) return;
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) last = c;
    CPU_ZERO(&mine);
    CPU_SET(last, &mine);
    rest = all;
    CPU_CLR(last, &rest);
    pid_t self = (pid_t)syscall(SYS_gettid);
    DIR *tasks = opendir("/proc/self/task");
    for (struct dirent *t; tasks && (t = readdir(tasks));) {
        pid_t tid = (pid_t)atoi(t->d_name);
        if (tid > 0) sched_setaffinity(tid, sizeof rest, tid == self ? &mine : &rest);
    }
    if (tasks) closedir(tasks);
}

#define CHECK(x)                                                             \
    do {                                                                     \
        CUresult r_ = (x);                                                   \
        if (r_) {                                                            \
            fprintf(stderr, "cu_launch: %s failed with CUresult %d\n", #x, r_); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

#define SYM(field, name)                                                     \
    do {                                                                     \
        *(void **)&D.field = dlsym(lib, name);                               \
        if (!D.field) {                                                      \
            fprintf(stderr, "cu_launch: libcuda.so.1 has no %s\n", name);    \
            return 1;                                                        \
        }                                                                    \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: cu_launch ITERATIONS REPEATS [CPUS]\n");
        return 2;
    }
    long iterations = atol(argv[1]);
    int repeats = atoi(argv[2]);
    if (iterations <= 0 || repeats <= 0 || repeats > 1000) return 2;
    if (argc > 3) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (char *s = argv[3], *end; *s; s = *end ? end + 1 : end) {
            CPU_SET((int)strtol(s, &end, 10), &set);
            if (end == s) return 2;
        }
        if (sched_setaffinity(0, sizeof set, &set)) return perror("cu_launch: sched_setaffinity"), 1;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return fprintf(stderr, "cu_launch: %s\n", dlerror()), 1;
    SYM(init, "cuInit");
    SYM(device_get, "cuDeviceGet");
    SYM(primary_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(ctx_sync, "cuCtxSynchronize");
    SYM(module_load, "cuModuleLoadData");
    SYM(get_function, "cuModuleGetFunction");
    SYM(launch, "cuLaunchKernel");
    SYM(event_create, "cuEventCreate");
    SYM(event_record, "cuEventRecord");
    SYM(event_query, "cuEventQuery");
    SYM(event_sync, "cuEventSynchronize");

    int dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(D.init(0));
    CHECK(D.device_get(&dev, 0));
    CHECK(D.primary_retain(&ctx, dev));
    CHECK(D.ctx_set(ctx));
    CHECK(D.module_load(&mod, PTX));
    CHECK(D.get_function(&fn, mod, "empty"));

    /* warm-up: about a quarter of a second, so clocks and the driver's queues are steady */
    for (double t0 = now_ns(); now_ns() - t0 < 250e6;) {
        for (int k = 0; k < 1000; k++) CHECK(D.launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(D.ctx_sync());
    }
    if (argc > 3) isolate_main_thread();
    if (argc > 4 && !strcmp(argv[4], "ab")) {
        CUresult (*direct)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
        *(void **)&direct = driver_symbol(lib, "cuLaunchKernel");
        if (!direct) return fprintf(stderr, "cu_launch: no driver cuLaunchKernel through glibc's dlsym\n"), 1;
        double *a = calloc((size_t)repeats, sizeof *a), *b = calloc((size_t)repeats, sizeof *b);
        double *diff = calloc((size_t)repeats, sizeof *diff);
        for (int r = 0; r < repeats; r++) {
            for (int half = 0; half < 2; half++) {
                int via_dlsym = (r + half) % 2;
                CHECK(D.ctx_sync());
                double t0 = now_ns();
                if (via_dlsym)
                    for (long k = 0; k < iterations; k++) CHECK(D.launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
                else
                    for (long k = 0; k < iterations; k++) CHECK(direct(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
                CHECK(D.ctx_sync());
                (via_dlsym ? a : b)[r] = (now_ns() - t0) / iterations;
            }
            diff[r] = a[r] - b[r];
        }
        printf("RESULT {\"pid\": %d, \"limiter_loaded\": %s, \"iterations\": %ld, \"repeats\": %d, "
               "\"distinct\": %s, \"dlsym_ns\": [",
               (int)getpid(), limiter_loaded() ? "true" : "false", iterations, repeats,
               (void *)direct != *(void **)&D.launch ? "true" : "false");
        for (int r = 0; r < repeats; r++) printf("%s%.2f", r ? ", " : "", a[r]);
        printf("], \"driver_ns\": [");
        for (int r = 0; r < repeats; r++) printf("%s%.2f", r ? ", " : "", b[r]);
        double base = median(b, repeats);
        printf("], \"driver_median_ns\": %.2f, \"added_ns\": %.2f}\n", base, median(diff, repeats));
        fflush(stdout);
        return 0;
    }
    double *per = calloc((size_t)repeats, sizeof *per), *sorted = calloc((size_t)repeats, sizeof *sorted);
    for (int r = 0; r < repeats; r++) {
        CHECK(D.ctx_sync());
        double t0 = now_ns();
        for (long k = 0; k < iterations; k++) CHECK(D.launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CHECK(D.ctx_sync());
        per[r] = (now_ns() - t0) / iterations;
    }

    /* The event calls themselves (the limiter does not intercept them): a record after a
     * launch, and a query of an event that completed, each timed over 2000 calls. */
    enum { NEV = 2000 };
    static CUevent ev[NEV];
    for (int k = 0; k < NEV; k++) CHECK(D.event_create(&ev[k], 0));
    double rec = 0, query = 0;
    for (int k = 0; k < NEV; k++) {
        CHECK(D.launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        double t0 = now_ns();
        CHECK(D.event_record(ev[k], NULL));
        rec += now_ns() - t0;
    }
    CHECK(D.ctx_sync());
    double t0 = now_ns();
    for (int k = 0; k < NEV; k++) CHECK(D.event_query(ev[k]));
    query = now_ns() - t0;

    memcpy(sorted, per, sizeof *per * (size_t)repeats);
    double min = sorted[0];
    for (int r = 1; r < repeats; r++) min = per[r] < min ? per[r] : min;
    printf("RESULT {\"pid\": %d, \"limiter_loaded\": %s, \"iterations\": %ld, \"repeats\": %d, \"ns\": [", (int)getpid(),
           limiter_loaded() ? "true" : "false", iterations, repeats);
    for (int r = 0; r < repeats; r++) printf("%s%.2f", r ? ", " : "", per[r]);
    printf("], \"median_ns\": %.2f, \"min_ns\": %.2f, \"event_record_ns\": %.1f, \"event_query_ns\": %.1f}\n",
           median(sorted, repeats), min, rec / NEV, query / NEV);
    fflush(stdout);
    return 0;
}
