/*
 * Compute shares by GPU time.
 *
 * Measurement: each process records CUDA events on the streams it launches on (a marker when a
 * stream becomes busy, an end event every bound/8 of estimated work, ~0.5 ms while others wait
 * or under a cap, and at most every 256 launches) and adds the elapsed time between completed
 * events to its slot and its tenant (busy_ns).  The same
 * events bound the work a process may have queued (~2 ms), so the GPU can change hands quickly.
 *
 * Arbitration: one tenant at a time holds the GPU's lease.  The hot path only reads the lease
 * word; when the lease expires (10 ms quantum), or its holder went idle, or an online tenant
 * waits behind an offline holder, a process performs a transition under the region's robust
 * mutex (trylock only, so nobody queues on it): the holder is charged min(measured GPU time,
 * wall time held), the next holder is picked, and the old holder's processes drain their queued
 * work before the new holder starts, so each tenant's measured time is its own.
 *   - choice: online before offline; then the lowest virtual time (charged / share), i.e. stride
 *     scheduling, with a tenant that starts wanting again brought up to one quantum behind;
 *   - fixed-share: also a token bucket refilled at the share, so it is a cap even on an idle GPU;
 *   - burst-share: a guarantee, keeps the lease while nobody else wants the GPU;
 *   - best-effort: a small weight, no cap.
 */
#define _GNU_SOURCE
#include "hooklist.h"
#include "internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define Q_NS 20000000ull            /* lease quantum (shares of 50% and more) */
#define Q_MIN_NS 5000000ull         /* ... and the shortest one */
#define IDLE_NS 2000000ull          /* a holder that launched nothing for this long is idle */
#define ONLINE_IDLE_NS 20000000ull  /* ... an online holder, for an offline tenant waiting */
#define DRAIN_MAX_NS 30000000ull    /* handover happens after this even if a holder did not drain */
#define INFLIGHT_MAX_NS 4000000ull  /* queued GPU work allowed while others wait, or under a cap */
#define INFLIGHT_FREE_NS 20000000ull /* ... and while nobody else wants the GPU */
/* Most launches between end events: tiny kernels are batched by estimated time (bound / 8) up to
 * this count.  At 16 the events cost a launch-bound PyTorch loop 8-9% on an H100 (an event record
 * and a few queries, ~0.5 us of driver time, every 16 launches of ~6.4 us); a query every 16
 * launches between records still cost it 3-4%.  Completed events are collected when the next
 * one is recorded, and after the program synchronises. */
#define BATCH_LAUNCHES 256
/* A stream whose last end event is older than this may have run dry: the next launch asks the
 * driver before counting the gap as GPU time (younger gaps are counted; the loop is launching). */
#define DRY_CHECK_NS 100000ull
#define BUCKET_NS 50000000ull       /* fixed-share tokens saved at most (burst after idle) */
#define MIN_TOKENS_NS 8000000ull   /* a fixed share waits for this much before a lease */
#define WANT_STALE_NS 50000000ull
#define WAIT_POLL_NS 2000000ull
#define BEST_EFFORT_WEIGHT 0.02

/* ------------------------------------------------------------------ small helpers */
static double dget(_Atomic uint64_t *p) {
    uint64_t b = atomic_load(p);
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static void dset(_Atomic uint64_t *p, double d) {
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    atomic_store(p, b);
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static int my_tid(void) {
    static __thread int tid;
    if (!tid) tid = (int)syscall(SYS_gettid);
    return tid;
}

static double weight(struct rg_tenant *t) {
    uint32_t pm = atomic_load(&t->share_permille);
    if (atomic_load(&t->policy) == POLICY_BEST_EFFORT || pm == 0) return BEST_EFFORT_WEIGHT;
    return pm > 1000 ? 1.0 : pm / 1000.0;
}

static int64_t tokens_now(struct rg_tenant *t, uint64_t now) {
    double tok = (double)atomic_load(&t->tokens_ns);
    uint64_t ts = atomic_load(&t->tokens_ts);
    double share = atomic_load(&t->share_permille) / 1000.0;
    if (now > ts) tok += (double)(now - ts) * share;
    return tok > (double)BUCKET_NS ? (int64_t)BUCKET_NS : (int64_t)tok;
}

static int is_fixed(struct rg_tenant *t) {
    return atomic_load(&t->policy) == POLICY_FIXED && atomic_load(&t->share_permille) > 0;
}

#define FOR_MEMBERS(rg, t, i)                                                 \
    for (int w_ = 0; w_ < RG_MAX_SLOTS / 64; w_++)                            \
        for (uint64_t b_ = atomic_load(&(t)->members[w_]); b_; b_ &= b_ - 1)  \
            for (int i = w_ * 64 + __builtin_ctzll(b_), once_ = 1; once_; once_ = 0)

/* ------------------------------------------------------------------ decisions (under the lock) */
static int wants(struct rg_tenant *t, uint64_t now) {
    uint64_t lw = atomic_load(&t->last_want_ns);
    return atomic_load(&t->waiting) > 0 && now - lw < WANT_STALE_NS;
}

static void add_charge(struct rg_region *rg, struct rg_tenant *t, uint64_t c, uint64_t now) {
    if (is_fixed(t)) {
        int64_t tok = tokens_now(t, now) - (int64_t)c;
        atomic_store(&t->tokens_ns, tok);
        atomic_store(&t->tokens_ts, now);
    }
    if (!c) return;
    atomic_fetch_add(&t->charged_ns, c);
    double p = dget(&t->pass) + (double)c / weight(t);
    dset(&t->pass, p);
    if (p > dget(&rg->h.vclock)) dset(&rg->h.vclock, p);
}

/* Charges the holder for its lease so far: the GPU time its processes measured since the lease
 * began, but never more than the lease's wall time (several streams or processes of one tenant
 * running at once must not count double).  Called at expiry, renewal and end of the lease. */
static void charge(struct rg_region *rg, unsigned ti, uint64_t now) {
    struct rg_tenant *t = &rg->t[ti];
    uint64_t busy = atomic_load(&t->busy_ns), b0 = atomic_load(&t->lease_busy0);
    uint64_t start = atomic_load(&t->charge_ts), done = atomic_load(&t->lease_charged);
    uint64_t total = busy > b0 ? busy - b0 : 0;
    uint64_t wall = now > start ? now - start : 0;
    uint64_t allowed = total < wall ? total : wall;
    uint64_t c = allowed > done ? allowed - done : 0;
    atomic_store(&t->lease_charged, done + c);
    atomic_store(&t->busy_snap, busy);
    add_charge(rg, t, c, now);
}

/* A new lease for t: GPU time measured after its previous lease was charged (late events) is
 * charged now, then the new lease's accounting starts. */
static void begin_lease_accounting(struct rg_region *rg, struct rg_tenant *t, uint64_t now) {
    uint64_t busy = atomic_load(&t->busy_ns), snap = atomic_load(&t->busy_snap);
    add_charge(rg, t, busy > snap ? busy - snap : 0, now);
    atomic_store(&t->busy_snap, busy);
    atomic_store(&t->lease_busy0, busy);
    atomic_store(&t->lease_charged, 0);
    atomic_store(&t->charge_ts, now);
}

/* Lease length: shorter for small shares, so that a 30/70 split interleaves finely (a 30%
 * tenant holds 12 ms at a time, a 70% one 20 ms); a fixed share never beyond its tokens. */
static uint64_t quantum(struct rg_tenant *t, uint64_t now) {
    double w = weight(t);
    uint64_t q = w >= 0.5 ? Q_NS : (uint64_t)((double)Q_NS * w / 0.5);
    if (q < Q_MIN_NS) q = Q_MIN_NS;
    if (!is_fixed(t)) return q;
    int64_t tok = tokens_now(t, now);
    if (tok < (int64_t)MIN_TOKENS_NS) tok = MIN_TOKENS_NS;
    return (uint64_t)tok < q ? (uint64_t)tok : q;
}

/* The next holder: online before offline, then the lowest virtual time; fixed-share tenants
 * without tokens are not eligible.  include: a tenant that wants the GPU even if not waiting
 * (the current holder), or -1. */
static int pick(struct rg_region *rg, uint64_t now, int include) {
    double vclock = dget(&rg->h.vclock);
    int best = -1, best_online = 0;
    double best_pass = 0;
    for (int i = 0; i < RG_MAX_TENANTS; i++) {
        struct rg_tenant *t = &rg->t[i];
        if (atomic_load(&t->state) != TENANT_READY) continue;
        if (i != include && !wants(t, now)) continue;
        if (atomic_exchange(&t->rejoin, 0)) {
            /* back after an idle spell: no credit beyond one quantum */
            double floor = vclock - (double)Q_NS / weight(t);
            if (dget(&t->pass) < floor) dset(&t->pass, floor);
        }
        if (is_fixed(t) && tokens_now(t, now) < (int64_t)MIN_TOKENS_NS) continue;
        int online = atomic_load(&t->klass) == CLASS_ONLINE;
        double p = dget(&t->pass);
        if (best < 0 || online > best_online || (online == best_online && p < best_pass)) {
            best = i;
            best_online = online;
            best_pass = p;
        }
    }
    return best;
}

static void grant(struct rg_region *rg, int n, uint64_t seq, uint64_t now) {
    struct rg_header *h = &rg->h;
    if (n < 0) {
        atomic_store(&h->lease, LEASE_MAKE(LEASE_FREE, LEASE_NONE, LEASE_NONE, seq));
        return;
    }
    struct rg_tenant *t = &rg->t[n];
    atomic_store(&h->lease_start_ns, now);
    begin_lease_accounting(rg, t, now);
    atomic_store(&h->lease_deadline_ns, now + quantum(t, now));
    atomic_fetch_add(&t->grants, 1);
    atomic_store(&h->lease, LEASE_MAKE(LEASE_HELD, (unsigned)n, LEASE_NONE, seq));
}

static int online_waiting(struct rg_region *rg, uint64_t now) {
    for (int i = 0; i < RG_MAX_TENANTS; i++) {
        struct rg_tenant *t = &rg->t[i];
        if (atomic_load(&t->state) == TENANT_READY && atomic_load(&t->klass) == CLASS_ONLINE && wants(t, now)) return 1;
    }
    return 0;
}

/* The holder launched nothing for a while and has nothing queued (as far as we can tell).  An
 * online holder keeps the GPU through longer host-side pauses when the one asking is offline. */
static int holder_idle(struct rg_region *rg, unsigned holder, uint64_t now, uint64_t wait_start, int asker_offline) {
    struct rg_tenant *t = &rg->t[holder];
    uint64_t idle = (asker_offline && atomic_load(&t->klass) == CLASS_ONLINE) ? ONLINE_IDLE_NS : IDLE_NS;
    if (!wait_start || now - wait_start < idle) return 0;
    FOR_MEMBERS(rg, t, i) {
        struct rg_slot *s = &rg->s[i];
        if (now - atomic_load(&s->last_active_ns) < idle) return 0;
        if (atomic_load(&s->pending_until_ns) > now) return 0;
    }
    return 1;
}

static int drained(struct rg_region *rg, unsigned holder, uint64_t seq, uint64_t now) {
    struct rg_tenant *t = &rg->t[holder];
    FOR_MEMBERS(rg, t, i) {
        struct rg_slot *s = &rg->s[i];
        if (atomic_load(&s->launched_seq) != seq) continue;
        if (atomic_load(&s->drained_seq) == seq) continue;
        if (atomic_load(&s->pending_until_ns) < now && now - atomic_load(&s->last_active_ns) > IDLE_NS) continue;
        return 0;
    }
    return 1;
}

/* Returns 1 if the lease changed, 0 if nothing was due, -1 if someone else holds the lock. */
static int transition(struct gl_dev *d, uint64_t wait_start) {
    struct rg_region *rg = d->rg;
    struct rg_header *h = &rg->h;
    if (gl_lock_region(rg, 1) != 0) {
        if (!gl_region_valid(rg)) atomic_store(&d->state, 2);
        return -1;
    }
    uint64_t now = gl_now_ns();
    uint64_t L = atomic_load(&h->lease);
    unsigned st = LEASE_STATE(L), holder = LEASE_HOLDER(L);
    uint64_t seq = LEASE_SEQ(L);
    int changed = 0;
    if (st > LEASE_DRAINING || (st != LEASE_FREE && holder >= RG_MAX_TENANTS)) {
        GL_LOG(LOG_ERROR, "region lease word is garbage; resetting it");
        grant(rg, -1, seq + 1, now);
        changed = 1;
    } else if (st == LEASE_FREE) {
        int n = pick(rg, now, -1);
        if (n >= 0) {
            grant(rg, n, seq + 1, now);
            changed = 1;
        }
    } else if (st == LEASE_HELD) {
        struct rg_tenant *ht = &rg->t[holder];
        int mine = holder == (unsigned)d->tidx;
        int expired = now >= atomic_load(&h->lease_deadline_ns);
        int idle = !mine && holder_idle(rg, holder, now, wait_start, atomic_load(&d->tn->klass) == CLASS_OFFLINE);
        int preempt = !mine && atomic_load(&ht->klass) == CLASS_OFFLINE && atomic_load(&d->tn->klass) == CLASS_ONLINE &&
                      online_waiting(rg, now);
        if (expired || idle || preempt) {
            charge(rg, holder, now);
            int n = pick(rg, now, (idle || preempt) ? -1 : (int)holder);
            if (n == (int)holder) {
                atomic_store(&h->lease_deadline_ns, now + quantum(ht, now));
            } else {
                atomic_store(&h->drain_deadline_ns, now + DRAIN_MAX_NS);
                atomic_store(&h->lease, LEASE_MAKE(LEASE_DRAINING, holder, n < 0 ? LEASE_NONE : (unsigned)n, seq));
            }
            changed = 1;
        }
    } else { /* LEASE_DRAINING */
        if (now >= atomic_load(&h->drain_deadline_ns) || drained(rg, holder, seq, now)) {
            charge(rg, holder, now);
            grant(rg, pick(rg, now, -1), seq + 1, now);
            changed = 1;
        }
    }
    if (changed) {
        atomic_fetch_add(&h->transitions, 1);
        atomic_fetch_add(&h->lease_futex, 1);
    }
    gl_unlock_region(rg);
    if (changed) futex_wake(&h->lease_futex);
    return changed;
}

/* ------------------------------------------------------------------ measurement */
static CUevent ev_get(struct gl_dev *d) {
    if (d->npool) return d->pool[--d->npool];
    CUevent e = NULL;
    if (R.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    return e;
}

static void ev_put(struct gl_dev *d, CUevent e) {
    if (!e) return;
    if (d->npool < (int)(sizeof d->pool / sizeof d->pool[0])) d->pool[d->npool++] = e;
    else R.cuEventDestroy_v2(e);
}

static CUresult ev_record(struct gl_meas_stream *m, CUevent e) {
    return m->ptsz && R.cuEventRecord_ptsz ? R.cuEventRecord_ptsz(e, m->s) : R.cuEventRecord(e, m->s);
}

static int mtry(struct gl_dev *d) {
    int z = 0;
    return atomic_compare_exchange_strong_explicit(&d->mlock, &z, 1, memory_order_acquire, memory_order_relaxed);
}
static void munlock(struct gl_dev *d) { atomic_store_explicit(&d->mlock, 0, memory_order_release); }

static struct gl_meas_stream *stream_state(struct gl_dev *d, CUstream s, int ptsz) {
    int tid = (s == CU_STREAM_PER_THREAD || (ptsz && s == NULL)) ? my_tid() : 0;
    for (int i = 0; i < d->nms; i++) {
        struct gl_meas_stream *m = &d->ms[i];
        if (m->s == s && m->ptsz == ptsz && m->tid == tid) return m;
    }
    if (d->nms >= (int)(sizeof d->ms / sizeof d->ms[0])) return NULL; /* not measured */
    struct gl_meas_stream *m = &d->ms[d->nms++];
    memset(m, 0, sizeof *m);
    m->s = s;
    m->ptsz = ptsz;
    m->tid = tid;
    return m;
}

static void add_busy(struct gl_dev *d, uint64_t ns, uint32_t launches) {
    atomic_fetch_add(&d->me->busy_ns, ns);
    atomic_fetch_add(&d->tn->busy_ns, ns);
    if (launches) {
        double per = (double)ns / launches;
        d->avg_cost_ns = d->avg_cost_ns > 0 ? 0.8 * d->avg_cost_ns + 0.2 * per : per;
    }
}

static uint64_t queued_est(struct gl_dev *d, struct gl_meas_stream *m) {
    uint64_t n = m->since;
    for (int k = 0; k < m->n; k++) n += m->ring_cnt[(m->head + k) % GL_RING];
    return (uint64_t)(n * d->avg_cost_ns);
}

/* Collects completed end events of one stream. */
static void poll_stream(struct gl_dev *d, struct gl_meas_stream *m) {
    while (m->n) {
        CUevent e = m->ring[m->head];
        CUresult q = R.cuEventQuery(e);
        if (q == CUDA_ERROR_NOT_READY) break;
        float ms = 0;
        if (q == CUDA_SUCCESS && m->prev && R.cuEventElapsedTime(&ms, m->prev, e) == CUDA_SUCCESS && ms > 0)
            add_busy(d, (uint64_t)((double)ms * 1e6), m->ring_cnt[m->head]);
        ev_put(d, m->prev);
        m->prev = e;
        m->head = (m->head + 1) % GL_RING;
        m->n--;
    }
    if (m->open && m->n == 0 && m->since == 0) { /* stream idle: the next launch starts a new period */
        ev_put(d, m->prev);
        m->prev = NULL;
        m->open = 0;
    }
}

static void record_end(struct gl_dev *d, struct gl_meas_stream *m, uint64_t now) {
    if (m->n == GL_RING) {
        R.cuEventSynchronize(m->ring[m->head]);
        poll_stream(d, m);
    }
    CUevent e = ev_get(d);
    if (!e) return;
    if (ev_record(m, e) != CUDA_SUCCESS) {
        ev_put(d, e);
        return;
    }
    m->ring[(m->head + m->n) % GL_RING] = e;
    m->ring_cnt[(m->head + m->n) % GL_RING] = m->since;
    m->ring_ts[(m->head + m->n) % GL_RING] = now;
    m->n++;
    m->since = 0;
    atomic_store(&d->me->pending_until_ns, now + queued_est(d, m));
    atomic_store(&d->me->last_active_ns, now);
    atomic_store(&d->me->launches, d->launches);
}

static void drain_self(struct gl_dev *d, uint64_t L) {
    uint64_t seq = LEASE_SEQ(L);
    if (atomic_load(&d->me->drained_seq) == seq) return;
    if (atomic_load(&d->me->launched_seq) == seq) {
        /* not drained until our measurements are in: others must not guess from estimates */
        atomic_store(&d->me->pending_until_ns, UINT64_MAX);
        if (R.cuCtxSynchronize) R.cuCtxSynchronize();
        while (!mtry(d)) sched_yield();
        for (int i = 0; i < d->nms; i++) poll_stream(d, &d->ms[i]);
        munlock(d);
    }
    atomic_store(&d->me->pending_until_ns, 0);
    atomic_store(&d->me->drained_seq, seq);
}

/* ------------------------------------------------------------------ the gate */
static inline void note_seq(struct gl_dev *d, uint64_t L) {
    uint64_t seq = LEASE_SEQ(L);
    if (GL_UNLIKELY(d->local_seq != seq)) {
        d->local_seq = seq;
        atomic_store(&d->me->launched_seq, seq);
    }
}

static void start_waiting(struct gl_dev *d) {
    atomic_store(&d->me->waiting, 1);
    if (atomic_fetch_add(&d->tn->waiting, 1) == 0) atomic_store(&d->tn->rejoin, 1);
    atomic_fetch_add(&d->rg->h.nwaiting, 1);
}

static void stop_waiting(struct gl_dev *d, uint64_t waited) {
    atomic_fetch_sub(&d->rg->h.nwaiting, 1);
    atomic_fetch_sub(&d->tn->waiting, 1);
    atomic_store(&d->me->waiting, 0);
    atomic_fetch_add(&d->me->waited_ns, waited);
}

static void gate_slow(struct gl_dev *d) {
    struct rg_header *h = &d->rg->h;
    uint64_t wait_start = 0, lock_fail_since = 0;
    gl_maybe_reload();
    for (;;) {
        if (atomic_load(&d->state) != 1 || atomic_load(&d->sched_off)) break; /* no compute limit */
        uint32_t fseq = atomic_load(&h->lease_futex);
        uint64_t now = gl_now_ns();
        if (lock_fail_since && now - lock_fail_since > 500000000ull) {
            /* The lease cannot change hands: a process holds the region's lock and is stuck
             * (stopped).  Never hang the program: stop gating its launches. */
            GL_LOG(LOG_ERROR, "region lock of GPU %s held for over 500 ms by a stuck process; "
                              "compute shares are not enforced in this process", d->uuid);
            atomic_store(&d->sched_off, 1);
            break;
        }
        uint64_t L = atomic_load(&h->lease);
        unsigned st = LEASE_STATE(L), holder = LEASE_HOLDER(L);
        if (st == LEASE_HELD && holder == (unsigned)d->tidx) {
            if (now < atomic_load(&h->lease_deadline_ns)) {
                note_seq(d, L);
                atomic_store(&d->me->last_active_ns, now);
                break;
            }
            int r = transition(d, wait_start);
            lock_fail_since = r < 0 ? (lock_fail_since ? lock_fail_since : now) : 0;
            if (r < 0) futex_wait(&h->lease_futex, fseq, 200000);
            continue;
        }
        if (st == LEASE_DRAINING && holder == (unsigned)d->tidx) drain_self(d, L);
        if (!wait_start) {
            wait_start = now;
            start_waiting(d);
        } else if (now - wait_start > 1000000000ull && (now - wait_start) % 1000000000ull < WAIT_POLL_NS) {
            /* waiting long: make sure no dead process still counts as wanting or holding */
            gl_reclaim_dead(d, 0);
        }
        atomic_store(&d->tn->last_want_ns, now);
        int r = transition(d, wait_start);
        lock_fail_since = r < 0 ? (lock_fail_since ? lock_fail_since : now) : 0;
        if (r > 0) continue;
        /* The next holder polls the drain itself, so that it is awake and launching the moment
         * the drain completes (a wake-up on a busy machine can take milliseconds). */
        uint64_t L2 = atomic_load(&h->lease);
        int next_me = LEASE_STATE(L2) == LEASE_DRAINING && LEASE_NEXT(L2) == (unsigned)d->tidx;
        futex_wait(&h->lease_futex, fseq, (r < 0 || next_me) ? 100000 : WAIT_POLL_NS);
    }
    if (wait_start) stop_waiting(d, gl_now_ns() - wait_start);
}

static inline struct gl_meas_stream *launch_begin(struct gl_dev *d, CUstream s, int ptsz) {
    if (GL_UNLIKELY((++d->launches & 4095) == 0)) gl_maybe_reload();
    if (atomic_load_explicit(&d->state, memory_order_acquire) != 1 || d->sched_off) return NULL;
    struct rg_header *h = &d->rg->h;
    uint64_t L = atomic_load_explicit(&h->lease, memory_order_acquire);
    int fast = 0;
    if (LEASE_STATE(L) == LEASE_HELD && LEASE_HOLDER(L) == (unsigned)d->tidx) {
        if (atomic_load_explicit(&h->nwaiting, memory_order_relaxed) == 0 && d->cfg.policy != POLICY_FIXED) {
            note_seq(d, L);
            fast = 1;
        } else if (atomic_load_explicit(&h->nwaiting, memory_order_relaxed) == 0) {
            /* a cap alone on the GPU: the coarse clock (a few ns) is enough to end the lease;
             * the GPU time is charged from measurements, not from the lease's length */
            if (gl_coarse_ns() < atomic_load_explicit(&h->lease_deadline_ns, memory_order_relaxed)) {
                note_seq(d, L);
                fast = 1;
            }
        } else {
            uint64_t now = gl_now_ns();
            if (now < atomic_load_explicit(&h->lease_deadline_ns, memory_order_relaxed)) {
                note_seq(d, L);
                atomic_store_explicit(&d->me->last_active_ns, now, memory_order_relaxed);
                fast = 1;
            }
        }
    }
    if (!fast) gate_slow(d);
    /* Measurement state is per process; a launch that finds another thread measuring goes
     * unmeasured (its GPU time is still inside the next measured interval of its stream). */
    if (!mtry(d)) return NULL;
    struct gl_meas_stream *m = stream_state(d, s, ptsz);
    if (!m) {
        munlock(d);
        return NULL;
    }
    if (m->open && m->since == 0 && m->n > 0 && gl_now_ns() - m->ring_ts[(m->head + m->n - 1) % GL_RING] >= DRY_CHECK_NS &&
        R.cuEventQuery(m->ring[(m->head + m->n - 1) % GL_RING]) == CUDA_SUCCESS) {
        /* The stream ran dry before this launch: close the measured period here, so the idle
         * time until now is not counted as GPU time. */
        poll_stream(d, m);
    }
    if (!m->open) {
        CUevent e = ev_get(d);
        if (e && ev_record(m, e) == CUDA_SUCCESS) {
            m->prev = e;
            m->open = 1;
            m->since = 0;
        } else {
            ev_put(d, e);
            munlock(d);
            return NULL;
        }
    }
    return m; /* still locked: launch_end releases */
}

static inline void launch_end(struct gl_dev *d, struct gl_meas_stream *m, int ok) {
    if (!m) return;
    if (ok && m->open) {
        m->since++;
        uint64_t since_est = (uint64_t)(m->since * d->avg_cost_ns);
        struct rg_header *h = &d->rg->h;
        uint64_t bound = (atomic_load_explicit(&h->nwaiting, memory_order_relaxed) || d->cfg.policy == POLICY_FIXED)
                             ? INFLIGHT_MAX_NS
                             : INFLIGHT_FREE_NS;
        /* An end event per launch for kernels of 50 us and more while it matters (others wait,
         * or a cap), so that time the stream sits idle is never counted; batches otherwise. */
        int per_launch = bound == INFLIGHT_MAX_NS && d->avg_cost_ns >= 50000;
        if (per_launch || m->since >= BATCH_LAUNCHES || since_est >= bound / 8 || d->avg_cost_ns <= 0) {
            uint64_t now = gl_now_ns();
            record_end(d, m, now);
            /* Bound the queued work so the GPU can change hands quickly: by the estimate, by
             * the age of the oldest pending end event (estimates can be low), and to two
             * launches while nothing has been measured yet. */
            if (m->n > 1 && (queued_est(d, m) > bound || d->avg_cost_ns <= 0 || now - m->ring_ts[m->head] > bound)) {
                if (R.cuEventQuery(m->ring[m->head]) == CUDA_ERROR_NOT_READY) R.cuEventSynchronize(m->ring[m->head]);
            }
            poll_stream(d, m);
        }
    }
    munlock(d);
}

void gl_sched_fini(struct gl_dev *d) {
    if (atomic_load(&d->state) != 1 || !d->me) return;
    atomic_store(&d->me->pending_until_ns, 0);
    atomic_store(&d->me->last_active_ns, 0);
    atomic_store(&d->me->drained_seq, atomic_load(&d->me->launched_seq));
}

/* ------------------------------------------------------------------ launch wrappers */
#define LAUNCH(name, stream, ptsz, ...)                                  \
    do {                                                                 \
        if (gl_init() != 0) return CUDA_ERROR_NOT_INITIALIZED;           \
        if (!gl_real_##name) return CUDA_ERROR_NOT_SUPPORTED;            \
        struct gl_dev *d = gl_dev_current();                             \
        if (!d) return gl_real_##name(__VA_ARGS__);                      \
        struct gl_meas_stream *m = launch_begin(d, (stream), (ptsz));    \
        CUresult r = gl_real_##name(__VA_ARGS__);                        \
        launch_end(d, m, r == CUDA_SUCCESS);                             \
        return r;                                                        \
    } while (0)

GL_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned sm, CUstream s, void **p, void **e) {
    LAUNCH(cuLaunchKernel, s, 0, f, gx, gy, gz, bx, by, bz, sm, s, p, e);
}

GL_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned sm, CUstream s, void **p, void **e) {
    LAUNCH(cuLaunchKernel_ptsz, s, 1, f, gx, gy, gz, bx, by, bz, sm, s, p, e);
}

GL_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    LAUNCH(cuLaunchKernelEx, c ? c->hStream : NULL, 0, c, f, p, e);
}

GL_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    LAUNCH(cuLaunchKernelEx_ptsz, c ? c->hStream : NULL, 1, c, f, p, e);
}

GL_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned sm, CUstream s, void **p) {
    LAUNCH(cuLaunchCooperativeKernel, s, 0, f, gx, gy, gz, bx, by, bz, sm, s, p);
}

GL_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned sm, CUstream s, void **p) {
    LAUNCH(cuLaunchCooperativeKernel_ptsz, s, 1, f, gx, gy, gz, bx, by, bz, sm, s, p);
}

GL_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { LAUNCH(cuGraphLaunch, s, 0, g, s); }

GL_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { LAUNCH(cuGraphLaunch_ptsz, s, 1, g, s); }

/* After the program waited for the GPU, collect the measurements that are complete: the status
 * is current, and a stream that is now idle starts a new measured period at its next launch
 * (the program's own pause is not counted as GPU time). */
static void after_sync(void) {
    struct gl_dev *d = gl_dev_current();
    if (!d || atomic_load(&d->state) != 1 || !mtry(d)) return;
    for (int i = 0; i < d->nms; i++) poll_stream(d, &d->ms[i]);
    munlock(d);
}

#define SYNC_WRAP(name, ...)                                             \
    do {                                                                 \
        if (gl_init() != 0) return CUDA_ERROR_NOT_INITIALIZED;           \
        if (!gl_real_##name) return CUDA_ERROR_NOT_SUPPORTED;            \
        CUresult r = gl_real_##name(__VA_ARGS__);                        \
        if (r == CUDA_SUCCESS) after_sync();                             \
        return r;                                                        \
    } while (0)

GL_EXPORT CUresult cuCtxSynchronize(void) { SYNC_WRAP(cuCtxSynchronize); }
GL_EXPORT CUresult cuStreamSynchronize(CUstream s) { SYNC_WRAP(cuStreamSynchronize, s); }
GL_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { SYNC_WRAP(cuStreamSynchronize_ptsz, s); }
