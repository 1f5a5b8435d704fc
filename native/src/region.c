/* The per-GPU shared region: creation, validation, tenants, process slots and reclamation. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t fnv1a(const void *p, size_t n, uint32_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t header_check(const struct rg_header *h) {
    return fnv1a(h->gpu_uuid, RG_UUID_LEN, fnv1a(h, 40, 2166136261u));
}

int gl_region_valid(const struct rg_region *rg) {
    const struct rg_header *h = &rg->h;
    return h->magic == RG_MAGIC && h->version == RG_VERSION && h->header_size == RG_HEADER_SIZE &&
           h->max_tenants == RG_MAX_TENANTS && h->max_slots == RG_MAX_SLOTS && h->total_size == RG_TOTAL_SIZE &&
           h->tenant_size == RG_TENANT_SIZE && h->slot_size == RG_SLOT_SIZE && h->check == header_check(h);
}

static void region_init(struct rg_region *rg, const char *uuid) {
    memset(rg, 0, sizeof *rg);
    struct rg_header *h = &rg->h;
    h->version = RG_VERSION;
    h->header_size = RG_HEADER_SIZE;
    h->max_tenants = RG_MAX_TENANTS;
    h->max_slots = RG_MAX_SLOTS;
    h->total_size = RG_TOTAL_SIZE;
    h->tenant_size = RG_TENANT_SIZE;
    h->slot_size = RG_SLOT_SIZE;
    snprintf(h->gpu_uuid, sizeof h->gpu_uuid, "%s", uuid);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    atomic_store(&h->lease, LEASE_MAKE(LEASE_FREE, LEASE_NONE, LEASE_NONE, 1));
    h->magic = RG_MAGIC;
    h->check = header_check(h);
}

/* Lock with a bound: a dead owner is recovered (robust mutex); a stuck or corrupt lock is
 * given up on after 500 ms, so nobody ever waits longer than that on the region. */
int gl_lock_region(struct rg_region *rg, int try_only) {
    int rc;
    if (try_only) {
        rc = pthread_mutex_trylock(&rg->h.lock);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        rc = pthread_mutex_timedlock(&rg->h.lock, &ts);
    }
    if (rc == EOWNERDEAD) {
        GL_LOG(LOG_INFO, "region lock owner died; recovered");
        pthread_mutex_consistent(&rg->h.lock);
        return 0;
    }
    if (rc == 0) return 0;
    if (rc == ETIMEDOUT) GL_LOG(LOG_ERROR, "region lock not released within 500 ms (its owner is stuck)");
    else if (rc != EBUSY) GL_LOG(LOG_ERROR, "region lock unusable (%s)", strerror(rc));
    return -1;
}

void gl_unlock_region(struct rg_region *rg) { pthread_mutex_unlock(&rg->h.lock); }

static off_t slot_off(int i) { return (off_t)RG_SLOTS_OFF + (off_t)i * RG_SLOT_SIZE; }

static int ofd_lock(int fd, int i, int type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = (short)type;
    fl.l_whence = SEEK_SET;
    fl.l_start = slot_off(i);
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* 1 if some other open file description holds the slot's byte lock. */
static int ofd_held(int fd, int i) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = slot_off(i);
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return 1; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

static uint64_t g_pidns;

int gl_slot_alive(struct gl_dev *d, int i) {
    if (i == d->slot) return 1;
    struct rg_slot *s = &d->rg->s[i];
    if ((atomic_load(&s->state) & 0xff) != SLOT_ACTIVE) return 0;
    if (!ofd_held(d->fd, i)) return 0;
    /* The lock is held; in our PID namespace also catch a forked child holding a dead parent's
     * lock, and PID reuse, from pid + start time. */
    if (s->pidns && s->pidns == g_pidns) {
        int pid = atomic_load(&s->pid);
        if (pid <= 0) return 1;
        if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
        uint64_t st = gl_proc_starttime(pid);
        if (st && s->starttime && st != s->starttime) return 0;
    }
    return 1;
}

static void reclaim_slot(struct gl_dev *d, int i) {
    struct rg_region *rg = d->rg;
    struct rg_slot *s = &rg->s[i];
    uint64_t st = atomic_load(&s->state);
    if ((st & 0xff) != SLOT_ACTIVE) return;
    /* ACTIVE -> reclaiming (state 2), exactly one reclaimer wins */
    if (!atomic_compare_exchange_strong(&s->state, &st, (st & ~0xffull) | 2)) return;
    int t = atomic_load(&s->tenant);
    if (t >= 0 && t < RG_MAX_TENANTS) atomic_fetch_and(&rg->t[t].members[i / 64], ~(1ull << (i % 64)));
    if (atomic_load(&s->waiting)) {
        if (t >= 0 && t < RG_MAX_TENANTS) atomic_fetch_sub(&rg->t[t].waiting, 1);
        atomic_fetch_sub(&rg->h.nwaiting, 1);
        atomic_store(&s->waiting, 0);
    }
    atomic_store(&s->mem_used, 0);
    atomic_store(&s->pid, 0);
    atomic_store(&s->state, (((st >> 8) + 1) << 8) | SLOT_FREE);
    GL_LOG(LOG_INFO, "reclaimed slot %d of a dead process", i);
}

/* Reclaims dead slots: those of our tenant only (tenant_only), or all. */
int gl_reclaim_dead(struct gl_dev *d, int tenant_only) {
    if (!d->rg) return 0;
    int n = 0;
    for (int i = 0; i < RG_MAX_SLOTS; i++) {
        if (tenant_only && !(atomic_load(&d->tn->members[i / 64]) & (1ull << (i % 64)))) continue;
        if ((atomic_load(&d->rg->s[i].state) & 0xff) == SLOT_ACTIVE && !gl_slot_alive(d, i)) {
            reclaim_slot(d, i);
            n++;
        }
    }
    return n;
}

uint64_t gl_tenant_mem_used(struct gl_dev *d) {
    struct rg_tenant *t = d->tn;
    uint64_t sum = 0;
    for (int w = 0; w < RG_MAX_SLOTS / 64; w++) {
        uint64_t bits = atomic_load(&t->members[w]);
        while (bits) {
            int i = w * 64 + __builtin_ctzll(bits);
            sum += atomic_load(&d->rg->s[i].mem_used);
            bits &= bits - 1;
        }
    }
    return sum;
}

static uint32_t name_hash(const char *s) { return fnv1a(s, strlen(s), 2166136261u) | 1u; }

static int find_tenant(struct rg_region *rg, const char *name, uint32_t h) {
    for (int i = 0; i < RG_MAX_TENANTS; i++) {
        struct rg_tenant *t = &rg->t[i];
        if (atomic_load_explicit(&t->state, memory_order_acquire) == TENANT_READY && t->name_hash == h &&
            strncmp(t->name, name, RG_NAME_LEN) == 0)
            return i;
    }
    return -1;
}

static uint64_t g_lock_wait_ns;

static int tenant_entry(struct rg_region *rg, const char *name) {
    uint32_t h = name_hash(name);
    int i = find_tenant(rg, name, h);
    if (i >= 0) return i;
    uint64_t w0 = gl_now_ns();
    int locked = gl_lock_region(rg, 0);
    g_lock_wait_ns += gl_now_ns() - w0;
    if (locked != 0) return -1;
    i = find_tenant(rg, name, h);
    if (i < 0) {
        for (int k = 0; k < RG_MAX_TENANTS; k++) {
            struct rg_tenant *t = &rg->t[k];
            if (atomic_load(&t->state) != TENANT_FREE) continue;
            memset((char *)t + 4, 0, offsetof(struct rg_tenant, members) - 4);
            snprintf(t->name, RG_NAME_LEN, "%s", name);
            t->name_hash = h;
            double zero = 0;
            uint64_t bits;
            memcpy(&bits, &zero, sizeof bits);
            atomic_store(&t->pass, bits);
            /* a fixed share starts with enough tokens for one lease, not a full bucket */
            atomic_store(&t->tokens_ns, 8000000);
            atomic_store(&t->tokens_ts, gl_now_ns());
            atomic_store_explicit(&t->state, TENANT_READY, memory_order_release);
            i = k;
            break;
        }
    }
    gl_unlock_region(rg);
    if (i < 0) GL_LOG(LOG_ERROR, "region tenant table full (%d tenants)", RG_MAX_TENANTS);
    return i;
}

static int claim_slot(struct gl_dev *d) {
    struct rg_region *rg = d->rg;
    int pid = (int)getpid();
    uint64_t start = gl_proc_starttime(pid);
    for (int round = 0; round < 2; round++) {
        int base = (int)((unsigned)pid * 2654435761u % RG_MAX_SLOTS);
        for (int k = 0; k < RG_MAX_SLOTS; k++) {
            int i = (base + k) % RG_MAX_SLOTS;
            struct rg_slot *s = &rg->s[i];
            uint64_t st = atomic_load(&s->state);
            if ((st & 0xff) != SLOT_FREE) continue;
            if (ofd_lock(d->fd, i, F_WRLCK) != 0) continue; /* someone else is claiming it */
            st = atomic_load(&s->state);
            if ((st & 0xff) != SLOT_FREE) {
                ofd_lock(d->fd, i, F_UNLCK);
                continue;
            }
            atomic_store(&s->pid, pid);
            s->starttime = start;
            s->pidns = g_pidns;
            atomic_store(&s->tenant, d->tidx);
            atomic_store(&s->mem_used, 0);
            atomic_store(&s->busy_ns, 0);
            atomic_store(&s->launches, 0);
            atomic_store(&s->last_active_ns, gl_now_ns());
            atomic_store(&s->pending_until_ns, 0);
            atomic_store(&s->launched_seq, 0);
            atomic_store(&s->drained_seq, 0);
            atomic_store(&s->waited_ns, 0);
            atomic_store(&s->waiting, 0);
            if (!atomic_compare_exchange_strong(&s->state, &st, (st & ~0xffull) | SLOT_ACTIVE)) {
                ofd_lock(d->fd, i, F_UNLCK);
                continue;
            }
            atomic_fetch_or(&rg->t[d->tidx].members[i / 64], 1ull << (i % 64));
            return i;
        }
        gl_reclaim_dead(d, 0);
    }
    GL_LOG(LOG_ERROR, "region has no free process slot (%d processes)", RG_MAX_SLOTS);
    return -1;
}

void gl_publish_cfg(struct gl_dev *d) {
    if (!d->rg || !d->tn) return;
    /* The region says "0 = none" (older libraries share it); mem_capped tells a cap of 0 apart. */
    int capped = d->cfg.mem_limit != GL_MEM_NONE;
    atomic_store(&d->tn->mem_limit, capped ? d->cfg.mem_limit : 0);
    atomic_store(&d->tn->mem_capped, (uint32_t)capped);
    atomic_store(&d->tn->share_permille, d->cfg.share_permille);
    atomic_store(&d->tn->policy, (uint32_t)d->cfg.policy);
    atomic_store(&d->tn->klass, (uint32_t)d->cfg.klass);
    atomic_store(&d->tn->config_gen, d->cfg_gen);
    atomic_store(&d->me->mem_limit, capped ? d->cfg.mem_limit : 0);
}

static int open_region(const char *path, const char *uuid) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0 || errno != ENOENT) return fd;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int t = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (t < 0) return -1;
    fchmod(t, 0666); /* processes of every user on the node register here */
    int ok = 0;
    if (ftruncate(t, RG_TOTAL_SIZE) == 0) {
        void *m = mmap(NULL, RG_TOTAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, t, 0);
        if (m != MAP_FAILED) {
            region_init(m, uuid);
            msync(m, RG_TOTAL_SIZE, MS_SYNC);
            munmap(m, RG_TOTAL_SIZE);
            ok = link(tmp, path) == 0 || errno == EEXIST; /* atomic publish; a racer may have won */
        }
    }
    close(t);
    unlink(tmp);
    if (!ok) return -1;
    return open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
}

int gl_region_attach(struct gl_dev *d) {
    uint64_t t0 = gl_now_ns(), c0 = gl_thread_cpu_ns();
    if (!g_pidns) g_pidns = gl_pidns();
    char path[1024];
    snprintf(path, sizeof path, "%s/gpu-%s.region", G.dir, d->uuid);
    int fd = open_region(path, d->uuid);
    if (fd < 0) {
        GL_LOG(LOG_WARN, "cannot open region %s (%s); limits apply to this process alone", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)RG_TOTAL_SIZE) {
        GL_LOG(LOG_ERROR, "region %s is not a gpuops region (size); limits apply to this process alone", path);
        close(fd);
        return -1;
    }
    struct rg_region *rg = mmap(NULL, RG_TOTAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rg == MAP_FAILED) {
        close(fd);
        return -1;
    }
    if (!gl_region_valid(rg) || strncmp(rg->h.gpu_uuid, d->uuid, RG_UUID_LEN) != 0) {
        GL_LOG(LOG_ERROR, "region %s is corrupt; limits apply to this process alone", path);
        munmap(rg, RG_TOTAL_SIZE);
        close(fd);
        return -1;
    }
    d->rg = rg;
    d->fd = fd;
    d->tidx = tenant_entry(rg, G.tenant);
    if (d->tidx < 0) goto fail;
    d->tn = &rg->t[d->tidx];
    d->slot = claim_slot(d);
    if (d->slot < 0) goto fail;
    d->me = &rg->s[d->slot];
    gl_publish_cfg(d);
    /* No sweep here: registration stays O(1).  Dead processes' usage is reclaimed when it
     * matters: before an allocation is refused, in cuMemGetInfo, and when slots run out. */
    d->me->init_ns = gl_now_ns() - t0;
    d->me->init_cpu_ns = gl_thread_cpu_ns() - c0;
    d->me->init_lock_wait_us = (uint32_t)(g_lock_wait_ns / 1000);
    if (!G.init_reported) { /* the library's own start-up counts once, with the first GPU */
        G.init_reported = 1;
        d->me->init_ns += G.init_wall_ns;
        d->me->init_cpu_ns += G.init_cpu_ns;
    }
    GL_LOG(LOG_DEBUG, "registered in %s slot %d tenant %s", path, d->slot, G.tenant);
    return 0;
fail:
    GL_LOG(LOG_ERROR, "cannot register in region %s; limits apply to this process alone", path);
    munmap(rg, RG_TOTAL_SIZE);
    close(fd);
    d->rg = NULL;
    d->tn = NULL;
    return -1;
}
