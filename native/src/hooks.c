/*
 * Interception: the real driver is reached through dlopen("libcuda.so.1"); programs reach our
 * wrappers through three doors, all of which map a *real* function pointer to its wrapper by
 * identity, so the ABI variant the driver chose (_v2, _ptsz) is kept exactly and unknown
 * symbols pass through untouched:
 *   1. exported symbols with the driver's names (programs linked with -lcuda, LD_PRELOAD);
 *   2. an exported dlsym (programs that dlopen libcuda/NVML themselves); RTLD_NEXT lookups are
 *      resolved relative to the real caller, not to this library;
 *   3. cuGetProcAddress and cuGetProcAddress_v2 (the CUDA 12/13 runtime, PyTorch), including
 *      the per-thread-default-stream (_ptsz) variants the driver returns for that flag.
 */
#define _GNU_SOURCE
#include "hooklist.h"
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stddef.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gl_state G = {.lock = PTHREAD_MUTEX_INITIALIZER};
struct gl_real R;

#define GL_DEFINE_REAL(name, ret, params, args) ret(*gl_real_##name) params;
GL_CUDA_HOOKS(GL_DEFINE_REAL)
GL_NVML_HOOKS(GL_DEFINE_REAL)
#undef GL_DEFINE_REAL

/* wrappers (defined in memory.c, sched.c and below) */
#define GL_DECLARE_WRAPPER(name, ret, params, args) GL_EXPORT ret name params;
GL_CUDA_HOOKS(GL_DECLARE_WRAPPER)
GL_NVML_HOOKS(GL_DECLARE_WRAPPER)
#undef GL_DECLARE_WRAPPER

struct hook {
    const char *name;
    void *wrapper;
    void **real;
    int nvml;
};
#define GL_HOOK_ENTRY(name, ret, params, args) {#name, (void *)name, (void **)&gl_real_##name, 0},
#define GL_NVML_ENTRY(name, ret, params, args) {#name, (void *)name, (void **)&gl_real_##name, 1},
static const struct hook g_hooks[] = {GL_CUDA_HOOKS(GL_HOOK_ENTRY) GL_NVML_HOOKS(GL_NVML_ENTRY)};
#define NHOOKS (sizeof g_hooks / sizeof g_hooks[0])

static void *(*real_dlsym)(void *, const char *);
static void *g_libcuda;
static void *g_libnvml;
static __thread int t_in_init;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_rc = -1;
static struct link_map *g_self_map;

static void find_real_dlsym(void) {
    if (real_dlsym) return;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !real_dlsym; i++)
        *(void **)&real_dlsym = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

void *gl_dlsym(void *handle, const char *name) {
    find_real_dlsym();
    return real_dlsym ? real_dlsym(handle, name) : NULL;
}

/* ------------------------------------------------------------------ configuration loading */
/* Who is which tenant.  The file is root's (mounted read-only into containers); when it is there
 * in any form, it decides: its name, or the closed default, never the environment.  "There" is
 * lstat's answer, so a dangling link is there.  It is opened without following a link and without
 * blocking (a FIFO would hang the program in open()), and must be a regular file whose first line,
 * without surrounding blanks, is a valid tenant name. */
#define TENANT_FILE "/etc/gpuops/tenant"
/* The tenant of programs whose tenant file is broken: not a valid name, so no table line and no
 * GPUOPS_TENANT can name it; they share one entry in each region, held to the closed default. */
#define TENANT_FILE_BROKEN "!bad-tenant-file"

static int tenant_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

/* 1: the file names a tenant (name); 0: there is no file; -1: the file is there but names no
 * valid tenant (why). */
static int read_tenant_file(char *name, size_t n, char *why, size_t wn) {
    struct stat st;
    if (lstat(TENANT_FILE, &st) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(why, wn, "cannot be examined (%s)", strerror(errno));
        return -1;
    }
    int fd = open(TENANT_FILE, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP) snprintf(why, wn, "is a symbolic link");
        else snprintf(why, wn, "cannot be opened (%s)", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, wn, "is not a regular file");
        return -1;
    }
    char buf[256];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(why, wn, "cannot be read (%s)", strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    const char *nl = memchr(buf, '\n', got);
    if (!nl && got == sizeof buf) {
        snprintf(why, wn, "is longer than a tenant name (%d characters at most)", RG_NAME_LEN - 1);
        return -1;
    }
    size_t b = 0, e = nl ? (size_t)(nl - buf) : got;
    while (b < e && (buf[b] == ' ' || buf[b] == '\t' || buf[b] == '\r')) b++;
    while (e > b && (buf[e - 1] == ' ' || buf[e - 1] == '\t' || buf[e - 1] == '\r')) e--;
    if (b == e) {
        snprintf(why, wn, "%s", got == 0 ? "is empty" : "has a blank first line");
        return -1;
    }
    if (e - b >= RG_NAME_LEN) {
        snprintf(why, wn, "is longer than a tenant name (%d characters at most)", RG_NAME_LEN - 1);
        return -1;
    }
    for (size_t i = b; i < e; i++) {
        if (!tenant_char(buf[i])) {
            snprintf(why, wn, "does not name a valid tenant (letters, digits, '.', '_' and '-' only)");
            return -1;
        }
    }
    snprintf(name, n, "%.*s", (int)(e - b), buf + b);
    return 1;
}

static void read_identity(void) {
    char name[RG_NAME_LEN] = "default", why[160];
    int from_file = read_tenant_file(name, sizeof name, why, sizeof why);
    if (from_file < 0) {
        G.identity_broken = 1;
        snprintf(name, sizeof name, "%s", TENANT_FILE_BROKEN);
        GL_LOG(LOG_ERROR,
               "tenant file %s %s: failing closed (GPUOPS_TENANT is not consulted), every GPU allocation is refused "
               "and compute is held to 1%% (fixed-share, offline) for this program, as tenant %s",
               TENANT_FILE, why, TENANT_FILE_BROKEN);
    }
    const char *env = getenv("GPUOPS_TENANT");
    if (from_file == 0 && env && *env) {
        if (strlen(env) < RG_NAME_LEN && strcmp(env, "*") != 0) snprintf(name, sizeof name, "%s", env);
        else GL_LOG(LOG_WARN, "ignoring GPUOPS_TENANT: not a valid tenant name");
        for (char *p = name; *p; p++) {
            if (!tenant_char(*p)) {
                GL_LOG(LOG_WARN, "tenant name %s is not valid; using 'default'", name);
                snprintf(name, sizeof name, "default");
                break;
            }
        }
    }
    snprintf(G.tenant, sizeof G.tenant, "%s", name);
    /* On a managed node the directory is fixed: the environment cannot point elsewhere. */
    const char *dir = "/run/gpuops/limiter";
    const char *envdir = getenv("GPUOPS_LIMITER_DIR");
    G.mandatory = access("/run/gpuops/limiter/mandatory", F_OK) == 0;
    if (!G.mandatory && envdir && *envdir) dir = envdir;
    snprintf(G.dir, sizeof G.dir, "%s", dir);
}

/* ------------------------------------------------------------------ the tenant table
 *
 * Fail closed.  A process takes its limits from, in order: the table; else (the table invalid,
 * unreadable or gone) the table it already had; else the last good copy on disk
 * (<dir>/tenants.last-good); else, when the directory is managed (a table file, or anything
 * named tenants.last-good, is there, or the node is mandatory), the most restrictive
 * configuration, gl_cfg_closed().  Only a directory with neither file describes tenants by the
 * environment alone (ad-hoc use of `gpuops limiter run`). */
#define TABLE_MAX (1 << 20)

static void table_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", G.dir, name); }

/* Reads at most TABLE_MAX bytes of an open file; NULL if it is larger or unreadable. */
static char *read_all(int fd, const struct stat *st, size_t *len) {
    if (st->st_size > TABLE_MAX) return NULL;
    char *buf = malloc((size_t)st->st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st->st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st->st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    *len = got;
    return buf;
}

/* The last good copy counts only if whoever controls the directory wrote it: a regular file
 * owned by the directory's owner and writable by nobody else (the table itself is the
 * directory owner's to write, so this copy is trusted exactly as far as the table is). */
static int load_last_good(struct gl_table *t, char *why, size_t n) {
    char path[600];
    table_path(path, sizeof path, "tenants.last-good");
    struct stat dst, st;
    if (stat(G.dir, &dst) != 0) {
        snprintf(why, n, "%s: %s", G.dir, strerror(errno));
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0) {
        snprintf(why, n, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != dst.st_uid || (st.st_mode & 022)) {
        close(fd);
        snprintf(why, n, "%s: not a regular file of the directory's owner, writable by it alone", path);
        return -1;
    }
    size_t len = 0;
    char *buf = read_all(fd, &st, &len);
    close(fd);
    if (!buf) {
        snprintf(why, n, "%s: unreadable or too large", path);
        return -1;
    }
    char err[160];
    int rc = gl_table_parse(buf, len, t, err, sizeof err);
    free(buf);
    if (rc != 0) snprintf(why, n, "%s: %s", path, err);
    return rc;
}

/* Keeps a copy of a table that parsed, for processes that start while the table is bad.  Only
 * the directory's owner writes it (root on a node: the agent, or a root process), atomically,
 * and only when it differs from the copy there. */
static void save_last_good(const char *text, size_t len) {
    struct stat dst, st;
    if (stat(G.dir, &dst) != 0 || dst.st_uid != geteuid()) return;
    char path[600], tmp[640];
    table_path(path, sizeof path, "tenants.last-good");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        size_t have = 0;
        char *old = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !(st.st_mode & 022) ? read_all(fd, &st, &have) : NULL;
        close(fd);
        int same = old && have == len && !memcmp(old, text, len);
        free(old);
        if (same) return;
    }
    snprintf(tmp, sizeof tmp, "%s/.tenants.last-good.%d.tmp", G.dir, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        GL_LOG(LOG_WARN, "cannot keep the last good tenant table: %s: %s", tmp, strerror(errno));
        return;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    int ok = done == len && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        GL_LOG(LOG_WARN, "cannot keep the last good tenant table in %s: %s", path, strerror(errno));
        unlink(tmp);
    }
}

static void set_table(struct gl_table *t) {
    if (G.table_ok) gl_table_free(&G.table);
    G.table = *t;
    G.table_ok = 1;
    G.fail_closed = 0;
    G.table_epoch++;
}

/* Whether the directory has no last good copy at all (lstat: a link, dangling or not, is a copy
 * that is there).  Only a directory with neither the table nor this copy is ad-hoc use; a copy
 * that is there but not trusted or not valid means the directory has had a table.  Anything
 * other than "does not exist" (a directory we cannot search, ...) counts as there. */
static int last_good_absent(char *why, size_t n) {
    char path[600];
    struct stat st;
    table_path(path, sizeof path, "tenants.last-good");
    if (lstat(path, &st) == 0) return 0;
    if (errno == ENOENT) return 1;
    snprintf(why, n, "%s: %s", path, strerror(errno));
    return 0;
}

/* The table is unusable (why): keep what this process has, else the last good copy, else fail
 * closed; absent: no table file.  Only a directory with no table and no last good copy, on a node
 * that is not mandatory, is ad-hoc use (the environment describes the tenant); any other
 * directory gets the closed default. */
static void table_unusable(const char *path, const char *why, int absent) {
    if (G.table_ok) {
        GL_LOG(LOG_ERROR, "tenant table %s %s; keeping the last good limits", path, why);
        return;
    }
    struct gl_table t;
    char lg[800];
    if (load_last_good(&t, lg, sizeof lg) == 0) {
        set_table(&t);
        GL_LOG(LOG_ERROR, "tenant table %s %s; using the last good table %s/tenants.last-good (generation %llu)",
               path, why, G.dir, (unsigned long long)t.generation);
        return;
    }
    if (absent && !G.mandatory && last_good_absent(lg, sizeof lg))
        return; /* never managed: the environment describes the tenant */
    if (!G.fail_closed) {
        G.fail_closed = 1;
        G.table_epoch++;
        GL_LOG(LOG_ERROR,
               "tenant table %s %s and there is no usable last good table (%s): failing closed, every GPU allocation "
               "is refused and compute is held to 1%% (fixed-share, offline) until a valid table appears",
               path, why, lg);
    }
}

/* (Re)loads the tenant table when the file changed (always when force). */
static void load_table(int force) {
    char path[600], why[200];
    table_path(path, sizeof path, "tenants");
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        /* remember the failure as the file's stamp, so the same failure is handled once */
        uint64_t mt = e == ENOENT ? 0 : 1, size = (uint64_t)e;
        if (!force && G.table_mtime_ns == mt && G.table_size == size && G.table_ino == 0) return;
        G.table_mtime_ns = mt;
        G.table_size = size;
        G.table_ino = 0;
        snprintf(why, sizeof why, "%s", e == ENOENT ? "does not exist" : strerror(e));
        table_unusable(path, why, e == ENOENT);
        return;
    }
    uint64_t mt = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    if (!force && mt == G.table_mtime_ns && (uint64_t)st.st_size == G.table_size && (uint64_t)st.st_ino == G.table_ino)
        return;
    G.table_mtime_ns = mt;
    G.table_size = (uint64_t)st.st_size;
    G.table_ino = (uint64_t)st.st_ino;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block */
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot be opened (%s)", strerror(errno));
        table_unusable(path, why, 0);
        return;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(why, sizeof why, "is not a regular file");
        table_unusable(path, why, 0);
        return;
    }
    size_t got = 0;
    char *buf = read_all(fd, &st, &got);
    close(fd);
    if (!buf) {
        snprintf(why, sizeof why, "%s", st.st_size > TABLE_MAX ? "is too large" : "cannot be read");
        table_unusable(path, why, 0);
        return;
    }
    struct gl_table t;
    char err[160];
    if (gl_table_parse(buf, got, &t, err, sizeof err) != 0) {
        snprintf(why, sizeof why, "is invalid (%s)", err);
        table_unusable(path, why, 0);
    } else {
        set_table(&t);
        save_last_good(buf, got);
        GL_LOG(LOG_DEBUG, "loaded tenant table %s generation %llu", path, (unsigned long long)t.generation);
    }
    free(buf);
}

static void apply_cfg(struct gl_dev *d) {
    struct gl_cfg tc = gl_cfg_closed();
    int found = 1;
    if (G.identity_broken) {
        /* the tenant file is there but names nobody: the closed default, whatever the table says */
    } else if (G.table_ok) {
        found = gl_table_lookup(&G.table, G.tenant, d->index, d->uuid, &tc);
        if (found < 0) {
            /* the GPU is under the limiter, but nothing says what this tenant may have */
            GL_LOG(LOG_ERROR,
                   "tenant table has no line for tenant %s on GPU %s and no 'tenant *' line: failing closed, every "
                   "allocation is refused and compute is held to 1%% (fixed-share, offline)",
                   G.tenant, d->uuid);
            tc = gl_cfg_closed();
            found = 1;
        }
    } else if (!G.fail_closed) {
        found = 0;
    }
    d->cfg = gl_cfg_lower(&tc, found, &G.env, d->index);
    d->cfg_gen = G.table_ok ? G.table.generation : 0;
}

void gl_maybe_reload(void) {
    uint64_t now = gl_now_ns();
    uint64_t next = atomic_load_explicit(&G.next_reload_check, memory_order_relaxed);
    if (now < next) return;
    if (!atomic_compare_exchange_strong(&G.next_reload_check, &next, now + 500000000ull)) return;
    if (pthread_mutex_trylock(&G.lock) != 0) return;
    uint64_t epoch_before = G.table_epoch;
    load_table(0);
    int changed = G.table_epoch != epoch_before;
    for (int i = 0; i < GL_MAX_DEV; i++) {
        struct gl_dev *d = &G.dev[i];
        if (atomic_load(&d->state) == 0) continue;
        if (atomic_load(&d->state) == 1 && !gl_region_valid(d->rg)) {
            GL_LOG(LOG_ERROR, "region of GPU %s was overwritten; enforcing the last good limits in this process alone",
                   d->uuid);
            atomic_store(&d->state, 2);
        }
        if (changed) {
            apply_cfg(d);
            if (atomic_load(&d->state) == 1) gl_publish_cfg(d);
        }
    }
    pthread_mutex_unlock(&G.lock);
}

/* ------------------------------------------------------------------ init */
static void resolve(void **dst, const char *name) { *dst = real_dlsym(g_libcuda, name); }

/* A forked child is a new process: it must register on its own if it uses CUDA, not account
 * into its parent's slot (and its parent's events belong to the parent's context). */
static void after_fork_child(void) {
    for (int i = 0; i < GL_MAX_DEV; i++) {
        struct gl_dev *d = &G.dev[i];
        if (atomic_load(&d->state) == 0) continue;
        if (d->rg) {
            close(d->fd);
            munmap(d->rg, RG_TOTAL_SIZE);
        }
        memset((void *)d, 0, sizeof *d); /* atomics included: the child has one thread */
        atomic_store(&d->local_used, 0);
        atomic_store(&d->mlock, 0);
        atomic_store(&d->sched_off, 0);
        atomic_store(&d->state, 0);
    }
    pthread_mutex_init(&G.lock, NULL);
    G.init_reported = 0;
}

static void do_init(void) {
    uint64_t w0 = gl_now_ns(), c0 = gl_thread_cpu_ns();
    pthread_atfork(NULL, NULL, after_fork_child);
    t_in_init = 1;
    gl_log_init();
    find_real_dlsym();
    if (!real_dlsym) {
        GL_LOG(LOG_ERROR, "cannot find the real dlsym; interception disabled");
        t_in_init = 0;
        return;
    }
    Dl_info info;
    if (dladdr1((void *)&do_init, &info, (void **)&g_self_map, RTLD_DL_LINKMAP) == 0) g_self_map = NULL;
    g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!g_libcuda) g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!g_libcuda) {
        GL_LOG(LOG_ERROR, "cannot load libcuda.so.1: %s", dlerror());
        t_in_init = 0;
        return;
    }
    for (size_t i = 0; i < NHOOKS; i++)
        if (!g_hooks[i].nvml) *g_hooks[i].real = real_dlsym(g_libcuda, g_hooks[i].name);
    resolve((void **)&R.cuInit, "cuInit");
    resolve((void **)&R.cuDeviceGetCount, "cuDeviceGetCount");
    resolve((void **)&R.cuDeviceGetUuid, "cuDeviceGetUuid");
    resolve((void **)&R.cuCtxGetDevice, "cuCtxGetDevice");
    resolve((void **)&R.cuCtxSynchronize, "cuCtxSynchronize");
    resolve((void **)&R.cuEventCreate, "cuEventCreate");
    resolve((void **)&R.cuEventDestroy_v2, "cuEventDestroy_v2");
    resolve((void **)&R.cuEventRecord, "cuEventRecord");
    resolve((void **)&R.cuEventRecord_ptsz, "cuEventRecord_ptsz");
    resolve((void **)&R.cuEventQuery, "cuEventQuery");
    resolve((void **)&R.cuEventSynchronize, "cuEventSynchronize");
    resolve((void **)&R.cuEventElapsedTime, "cuEventElapsedTime");
    resolve((void **)&R.cuMemFree_v2, "cuMemFree_v2");
    resolve((void **)&R.cuDriverGetVersion, "cuDriverGetVersion");
    resolve((void **)&R.cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
    gl_env_read(&G.env);
    read_identity();
    load_table(1);
    atomic_store(&G.next_reload_check, gl_now_ns() + 500000000ull);
    G.ready = 1;
    G.init_wall_ns = gl_now_ns() - w0;
    G.init_cpu_ns = gl_thread_cpu_ns() - c0;
    g_init_rc = 0;
    t_in_init = 0;
}

int gl_init(void) {
    if (GL_LIKELY(g_init_rc == 0)) return 0;
    if (t_in_init) return -1;
    pthread_once(&g_once, do_init);
    return g_init_rc;
}

static void nvml_resolve(void) {
    find_real_dlsym();
    if (!real_dlsym) return;
    g_libnvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD); /* only if the program loaded it */
    if (!g_libnvml) return;
    for (size_t i = 0; i < NHOOKS; i++)
        if (g_hooks[i].nvml) *g_hooks[i].real = real_dlsym(g_libnvml, g_hooks[i].name);
}

static void nvml_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, nvml_resolve);
}

/* ------------------------------------------------------------------ devices */
static void format_uuid(const CUuuid *u, char *out, size_t n) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

struct gl_dev *gl_dev_get(int index) {
    if (index < 0 || index >= GL_MAX_DEV) return NULL;
    struct gl_dev *d = &G.dev[index];
    if (GL_LIKELY(atomic_load_explicit(&d->state, memory_order_acquire) != 0)) return d;
    pthread_mutex_lock(&G.lock);
    if (atomic_load(&d->state) == 0) {
        d->index = index;
        d->slot = -1;
        d->tidx = -1;
        CUuuid u;
        if (!R.cuDeviceGetUuid || R.cuDeviceGetUuid(&u, index) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&G.lock);
            return NULL; /* driver not initialised or no such device: let the driver answer */
        }
        format_uuid(&u, d->uuid, sizeof d->uuid);
        apply_cfg(d);
        int st = gl_region_attach(d) == 0 ? 1 : 2;
        atomic_store_explicit(&d->state, st, memory_order_release);
    }
    pthread_mutex_unlock(&G.lock);
    return d;
}

struct gl_dev *gl_dev_current(void) {
    if (G.ndev == 1) return gl_dev_get(0);
    CUdevice dev;
    if (!R.cuCtxGetDevice || R.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return NULL;
    return gl_dev_get(dev);
}

/* ------------------------------------------------------------------ symbol mapping */
static void *map_pointer(void *p) {
    if (!p) return p;
    for (size_t i = 0; i < NHOOKS; i++)
        if (*g_hooks[i].real == p) return g_hooks[i].wrapper;
    return p;
}

/* Driver and NVML names: "cu" or "nvml" followed by a capital (not curl_..., cuserid). */
static int is_hooked_name(const char *name) {
    if (!name) return 0;
    if (name[0] == 'c' && name[1] == 'u') return name[2] >= 'A' && name[2] <= 'Z';
    return !strncmp(name, "nvml", 4) && name[4] >= 'A' && name[4] <= 'Z';
}

/* RTLD_NEXT as the caller would have seen it: the first definition after the caller's object. */
static void *next_after(void *caller, const char *name) {
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm || lm == g_self_map)
        return real_dlsym(RTLD_NEXT, name);
    for (struct link_map *o = lm->l_next; o; o = o->l_next) {
        if (o == g_self_map) {
            for (size_t i = 0; i < NHOOKS; i++)
                if (!strcmp(g_hooks[i].name, name)) return g_hooks[i].wrapper;
            if (!strcmp(name, "dlsym")) return (void *)dlsym;
            continue;
        }
        if (!o->l_name || !o->l_name[0] || strstr(o->l_name, "linux-vdso")) continue;
        /* a proper handle for that object (link_map pointers are not valid handles for objects
         * the program did not dlopen) */
        void *h = dlopen(o->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        void *p = real_dlsym(h, name);
        struct link_map *owner = NULL;
        int mine = p && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == o;
        dlclose(h);
        if (mine) return p;
    }
    return NULL;
}

GL_EXPORT void *dlsym(void *handle, const char *name) {
    find_real_dlsym();
    if (!real_dlsym) return NULL;
    void *p = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), name) : real_dlsym(handle, name);
    if (!p || t_in_init || !is_hooked_name(name)) return p;
    if (name[0] == 'n') {
        nvml_init();
    } else if (g_init_rc != 0) {
        /* Only a program that has the driver loaded can be looking up driver functions; never
         * load it into other programs (this dlsym serves every process the library is in). */
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h) return p;
        dlclose(h);
        if (gl_init() != 0) return p;
    }
    return map_pointer(p);
}

/* ------------------------------------------------------------------ cuInit, cuGetProcAddress */
GL_EXPORT CUresult cuInit(unsigned flags) {
    if (gl_init() != 0 || !gl_real_cuInit) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = gl_real_cuInit(flags);
    if (r == CUDA_SUCCESS && !G.ndev && R.cuDeviceGetCount) {
        int n = 0;
        if (R.cuDeviceGetCount(&n) == CUDA_SUCCESS) G.ndev = n;
    }
    return r;
}

GL_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    if (gl_init() != 0 || !gl_real_cuGetProcAddress) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = gl_real_cuGetProcAddress(sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_pointer(*pfn);
    return r;
}

GL_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    if (gl_init() != 0 || !gl_real_cuGetProcAddress_v2) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = gl_real_cuGetProcAddress_v2(sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && pfn) *pfn = map_pointer(*pfn);
    return r;
}

/* ------------------------------------------------------------------ NVML memory view */
static struct gl_dev *dev_by_nvml(nvmlDevice_t dev) {
    static nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned);
    if (!get_uuid && g_libnvml) *(void **)&get_uuid = real_dlsym(g_libnvml, "nvmlDeviceGetUUID");
    if (!get_uuid || g_init_rc != 0) return NULL;
    char uuid[96];
    if (get_uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS) return NULL;
    for (int i = 0; i < GL_MAX_DEV; i++) {
        struct gl_dev *d = &G.dev[i];
        if (atomic_load(&d->state) != 0 && !strcasecmp(d->uuid, uuid)) return d;
    }
    return NULL;
}

static void tenant_view(struct gl_dev *d, unsigned long long *total, unsigned long long *used,
                        unsigned long long *free_b) {
    uint64_t limit = gl_mem_limit(d);
    if (limit == GL_MEM_NONE) return;
    uint64_t u = atomic_load(&d->state) == 1 ? gl_tenant_mem_used(d) : atomic_load(&d->local_used);
    unsigned long long t = *total < limit ? *total : limit;
    unsigned long long f = u < t ? t - u : 0;
    *total = t;
    *used = u;
    if (*free_b > f) *free_b = f;
}

GL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    nvml_init();
    if (!gl_real_nvmlDeviceGetMemoryInfo) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = gl_real_nvmlDeviceGetMemoryInfo(dev, m);
    if (r == NVML_SUCCESS && m) {
        struct gl_dev *d = dev_by_nvml(dev);
        if (d) tenant_view(d, &m->total, &m->used, &m->free);
    }
    return r;
}

GL_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    nvml_init();
    if (!gl_real_nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = gl_real_nvmlDeviceGetMemoryInfo_v2(dev, m);
    if (r == NVML_SUCCESS && m) {
        struct gl_dev *d = dev_by_nvml(dev);
        if (d) tenant_view(d, &m->total, &m->used, &m->free);
    }
    return r;
}

__attribute__((destructor)) static void gl_fini(void) {
    if (g_init_rc != 0) return;
    for (int i = 0; i < GL_MAX_DEV; i++) gl_sched_fini(&G.dev[i]);
}
