/* Creation and attachment of the shared fake-GPU state file. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct fg_state *g_state;
static int g_proc = -1;
static pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t fg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strtoull(v, NULL, 0);
}

static const char *state_path(void) {
    const char *p = getenv("FAKECUDA_STATE");
    return (p && *p) ? p : "/tmp/fakecuda.state";
}

/* What a CUDA context costs and what the driver reserves, per model, as measured on the real
 * one: the H100 figures are docs/gpu-runs/2026-11-26b (a PyTorch process held 518 MiB before
 * any allocation: memory-default.json; nvidia-smi's memory.reserved 480 MiB: nvml.json).  A
 * fake GPU of no model costs what the H100's context costs and reserves nothing.
 * FAKECUDA_CONTEXT_BYTES and FAKECUDA_RESERVED override the model's figures. */
struct fg_model {
    const char *key;
    const char *name;
    uint64_t ctx_bytes;
    uint64_t reserved;
};
static const struct fg_model g_models[] = {
    {"", "", 518ull << 20, 0},
    {"h100", "NVIDIA H100 80GB HBM3", 518ull << 20, 480ull << 20},
};

static const struct fg_model *find_model(const char *key) {
    for (size_t i = 0; key && *key && i < sizeof g_models / sizeof g_models[0]; i++)
        if (strcmp(g_models[i].key, key) == 0) return &g_models[i];
    return &g_models[0];
}

static void init_state(struct fg_state *st) {
    memset(st, 0, sizeof(*st));
    uint64_t ndev = env_u64("FAKECUDA_DEVICES", 1);
    if (ndev < 1) ndev = 1;
    if (ndev > FG_MAX_DEV) ndev = FG_MAX_DEV;
    uint64_t mem = env_u64("FAKECUDA_MEMORY", 16ull << 30);
    const struct fg_model *model = find_model(getenv("FAKECUDA_MODEL"));
    uint64_t ctx = env_u64("FAKECUDA_CONTEXT_BYTES", model->ctx_bytes);
    uint64_t reserved = env_u64("FAKECUDA_RESERVED", model->reserved);
    if (reserved > mem) reserved = mem;
    st->version = FG_VERSION;
    st->ndev = (uint32_t)ndev;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&st->lock, &a);
    pthread_mutexattr_destroy(&a);
    for (uint32_t i = 0; i < ndev; i++) {
        struct fg_dev *d = &st->dev[i];
        d->total_mem = mem - reserved;
        d->reserved_mem = reserved;
        d->ctx_bytes = ctx;
        static const uint8_t base[16] = {0xfa, 0x4e, 0x00, 0x00, 0x6b, 0x1d, 0x4c, 0x2e,
                                         0x9a, 0x51, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
        memcpy(d->uuid, base, 16);
        d->uuid[15] = (uint8_t)i;
        if (model->name[0]) snprintf(d->name, sizeof d->name, "%s", model->name);
        else snprintf(d->name, sizeof d->name, "Fake GPU %u", i);
    }
    st->magic = FG_MAGIC;
}

struct fg_state *fg_attach(void) {
    pthread_mutex_lock(&g_attach_lock);
    if (g_state) {
        pthread_mutex_unlock(&g_attach_lock);
        return g_state;
    }
    const char *path = state_path();
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        /* Create under a private name, initialise, then publish atomically. */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
        int t = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (t >= 0) {
            if (ftruncate(t, sizeof(struct fg_state)) == 0) {
                struct fg_state *st =
                    mmap(NULL, sizeof(struct fg_state), PROT_READ | PROT_WRITE, MAP_SHARED, t, 0);
                if (st != MAP_FAILED) {
                    init_state(st);
                    munmap(st, sizeof(struct fg_state));
                    if (link(tmp, path) != 0 && errno != EEXIST) perror("fakecuda: link");
                }
            }
            close(t);
            unlink(tmp);
        }
        fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (fd < 0) {
        fprintf(stderr, "fakecuda: cannot open state %s: %s\n", path, strerror(errno));
        pthread_mutex_unlock(&g_attach_lock);
        return NULL;
    }
    struct fg_state *st = mmap(NULL, sizeof(struct fg_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (st == MAP_FAILED || st->magic != FG_MAGIC) {
        fprintf(stderr, "fakecuda: bad state file %s\n", path);
        pthread_mutex_unlock(&g_attach_lock);
        return NULL;
    }
    g_state = st;
    pthread_mutex_unlock(&g_attach_lock);
    return st;
}

static uint64_t proc_starttime(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* after ") " comes field 3; starttime is field 22 */
    int field = 2;
    for (; *p; p++) {
        if (*p == ' ') {
            field++;
            if (field == 22) return strtoull(p + 1, NULL, 10);
        }
    }
    return 0;
}

int fg_proc_alive(const struct fg_proc *p) {
    int pid = atomic_load(&p->pid);
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t st = proc_starttime(pid);
    return st != 0 && st == p->starttime;
}

/* A locker that finds the lock's owner dead may find a memory move half made (the device's count
 * changed, the process's entry not yet): the device's count is recounted from the entries, which
 * are what the driver frees when a process dies. */
static void recount(struct fg_state *st) {
    for (int d = 0; d < FG_MAX_DEV; d++) {
        uint64_t sum = 0;
        for (int i = 0; i < FG_MAX_PROCS; i++)
            if (atomic_load(&st->procs[i].pid) > 0) sum += atomic_load(&st->procs[i].mem[d]);
        atomic_store(&st->dev[d].used_mem, sum);
    }
}

static void lock_state(struct fg_state *st) {
    int rc = pthread_mutex_lock(&st->lock);
    if (rc == EOWNERDEAD) {
        recount(st);
        pthread_mutex_consistent(&st->lock);
    }
}

void fg_lock(struct fg_state *st) { lock_state(st); }

void fg_unlock(struct fg_state *st) { pthread_mutex_unlock(&st->lock); }

static void release_entry(struct fg_state *st, struct fg_proc *p) {
    for (int d = 0; d < FG_MAX_DEV; d++) {
        uint64_t m = atomic_exchange(&p->mem[d], 0);
        if (m) atomic_fetch_sub(&st->dev[d].used_mem, m);
        atomic_store(&p->ctxs[d], 0);
    }
    atomic_store(&p->pid, 0);
}

void fg_sweep_dead(struct fg_state *st) {
    lock_state(st);
    for (int i = 0; i < FG_MAX_PROCS; i++) {
        struct fg_proc *p = &st->procs[i];
        if (atomic_load(&p->pid) > 0 && !fg_proc_alive(p)) release_entry(st, p);
    }
    pthread_mutex_unlock(&st->lock);
}

int fg_proc_index(void) {
    if (g_proc >= 0) return g_proc;
    struct fg_state *st = fg_attach();
    if (!st) return -1;
    pthread_mutex_lock(&g_attach_lock);
    if (g_proc >= 0) {
        pthread_mutex_unlock(&g_attach_lock);
        return g_proc;
    }
    pid_t me = getpid();
    uint64_t start = proc_starttime(me);
    lock_state(st);
    int chosen = -1;
    for (int i = 0; i < FG_MAX_PROCS && chosen < 0; i++) {
        struct fg_proc *p = &st->procs[i];
        int pid = atomic_load(&p->pid);
        if (pid == 0) {
            chosen = i;
        } else if (!fg_proc_alive(p)) {
            release_entry(st, p);
            chosen = i;
        }
    }
    if (chosen >= 0) {
        struct fg_proc *p = &st->procs[chosen];
        p->starttime = start;
        for (int d = 0; d < FG_MAX_DEV; d++) {
            atomic_store(&p->mem[d], 0);
            atomic_store(&p->busy_ns[d], 0);
            atomic_store(&p->ctxs[d], 0);
        }
        atomic_store(&p->kernels, 0);
        atomic_store(&p->pid, (int32_t)me);
    }
    pthread_mutex_unlock(&st->lock);
    g_proc = chosen;
    pthread_mutex_unlock(&g_attach_lock);
    return chosen;
}
