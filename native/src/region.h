/*
 * Layout of the per-GPU shared region file <dir>/gpu-<UUID>.region.
 *
 * Fixed little-endian layout, mirrored by gpuops/node/limiter.py (which checks the offsets
 * against `gpuops-limiter-layout`).  Every field that more than one process writes is a 32- or
 * 64-bit atomic; the hot paths (allocation accounting, launch gating) only use atomics.  The
 * robust mutex serialises the rare structural changes (creating a tenant entry, lease
 * transitions); process slots are claimed lock-free, and a slot's owner holds an OFD byte lock
 * on the slot's first byte for its whole life, so a dead owner is recognised even across PID
 * namespaces, and PID reuse is recognised from pid + start time.
 */
#ifndef GPUOPS_REGION_H
#define GPUOPS_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define RG_MAGIC 0x314e4f4947455250ULL /* "PREGION1" */
#define RG_VERSION 1u
#define RG_MAX_TENANTS 64
#define RG_MAX_SLOTS 1024
#define RG_NAME_LEN 64
#define RG_UUID_LEN 48

#define RG_HEADER_SIZE 4096u
#define RG_TENANT_SIZE 512u
#define RG_SLOT_SIZE 128u
#define RG_TENANTS_OFF RG_HEADER_SIZE
#define RG_SLOTS_OFF (RG_TENANTS_OFF + RG_MAX_TENANTS * RG_TENANT_SIZE)
#define RG_TOTAL_SIZE (RG_SLOTS_OFF + RG_MAX_SLOTS * RG_SLOT_SIZE)
#define RG_CTX_LOCK_OFF 296u /* rg_header.ctx_lock_byte */

/* lease word: bits 0-7 state, 8-15 holder tenant, 16-23 next tenant, 24-63 sequence */
enum { LEASE_FREE = 0, LEASE_HELD = 1, LEASE_DRAINING = 2 };
#define LEASE_NONE 0xffu
#define LEASE_STATE(l) ((unsigned)((l)&0xffu))
#define LEASE_HOLDER(l) ((unsigned)(((l) >> 8) & 0xffu))
#define LEASE_NEXT(l) ((unsigned)(((l) >> 16) & 0xffu))
#define LEASE_SEQ(l) ((l) >> 24)
#define LEASE_MAKE(st, h, n, seq) \
    ((uint64_t)(st) | ((uint64_t)(h) << 8) | ((uint64_t)(n) << 16) | ((uint64_t)(seq) << 24))

enum { POLICY_BEST_EFFORT = 0, POLICY_FIXED = 1, POLICY_BURST = 2 };
enum { CLASS_ONLINE = 0, CLASS_OFFLINE = 1 };
enum { TENANT_FREE = 0, TENANT_READY = 2 };
enum { SLOT_FREE = 0, SLOT_ACTIVE = 1 };

struct rg_header {
    uint64_t magic;            /* 0 */
    uint32_t version;          /* 8 */
    uint32_t header_size;      /* 12 */
    uint32_t max_tenants;      /* 16 */
    uint32_t max_slots;        /* 20 */
    uint64_t total_size;       /* 24 */
    uint32_t tenant_size;      /* 32 */
    uint32_t slot_size;        /* 36 */
    uint32_t check;            /* 40: checksum of bytes 0..40 and the UUID */
    uint32_t pad0;             /* 44 */
    char gpu_uuid[RG_UUID_LEN];/* 48 */
    uint8_t pad1[32];          /* 96 */
    union {                    /* 128 */
        pthread_mutex_t lock;
        uint8_t lock_area[64];
    };
    /* 192: scheduler state, written under the lock, read lock-free */
    _Atomic uint64_t lease;            /* 192 */
    _Atomic uint64_t lease_start_ns;   /* 200 */
    _Atomic uint64_t lease_deadline_ns;/* 208 */
    _Atomic uint64_t drain_deadline_ns;/* 216 */
    _Atomic uint32_t lease_futex;      /* 224: bumped on every lease change */
    _Atomic uint32_t nwaiting;         /* 228: processes waiting at the gate */
    _Atomic uint64_t vclock;           /* 232: double, virtual time of the last grant */
    _Atomic uint64_t transitions;      /* 240 */
    uint8_t pad2[8];                   /* 248 */
    /* 256: what the driver keeps of this GPU's memory, as the limiter observed it (context.c):
     * the device memory one CUDA context costs, from the first measurement no other context
     * creation disturbed, under the driver version it was taken with; and what CUDA programs
     * can use of the card (cuDeviceTotalMem: NVML's total less what the driver reserves). */
    _Atomic uint64_t ctx_bytes;        /* 256: valid when ctx_measured > 0 */
    _Atomic uint32_t ctx_driver;       /* 264: cuDriverGetVersion of that measurement */
    _Atomic uint32_t ctx_measured;     /* 268: clean measurements under that driver */
    _Atomic uint64_t ctx_max;          /* 272: the largest of them */
    _Atomic uint64_t cuda_total;       /* 280: cuDeviceTotalMem, bytes */
    _Atomic uint64_t ctx_unmeasured;   /* 288: contexts made without a measurement (bumped before and after) */
    uint8_t ctx_lock_byte[8];          /* 296: OFD lock held while a context is made and measured */
    uint8_t reserved[RG_HEADER_SIZE - 304];
};

struct rg_tenant {
    _Atomic uint32_t state;            /* 0 */
    uint32_t name_hash;                /* 4 */
    char name[RG_NAME_LEN];            /* 8 */
    /* configuration (from the tenant table, lowered by the environment of its processes) */
    _Atomic uint64_t mem_limit;        /* 72: bytes, 0 = none unless mem_capped */
    _Atomic uint32_t share_permille;   /* 80: 0 = none */
    _Atomic uint32_t policy;           /* 84 */
    _Atomic uint32_t klass;            /* 88 */
    _Atomic uint32_t waiting;          /* 92: processes of this tenant waiting at the gate */
    _Atomic uint64_t busy_ns;          /* 96: measured GPU time, cumulative */
    _Atomic uint64_t charged_ns;       /* 104: GPU time charged to the scheduler */
    _Atomic uint64_t pass;             /* 112: double, virtual time (charged / weight) */
    _Atomic int64_t tokens_ns;         /* 120: fixed-share bucket */
    _Atomic uint64_t tokens_ts;        /* 128 */
    _Atomic uint64_t busy_snap;        /* 136: busy_ns at the last charge */
    _Atomic uint64_t charge_ts;        /* 144: start of its current (or last) lease */
    _Atomic uint64_t last_want_ns;     /* 152: last time one of its processes waited */
    _Atomic uint64_t config_gen;       /* 160: table generation the configuration came from */
    _Atomic uint64_t grants;           /* 168 */
    _Atomic uint32_t rejoin;           /* 176: started wanting after an idle spell */
    _Atomic uint32_t mem_capped;       /* 180: 1 = mem_limit is a cap, even 0 (nothing may be allocated) */
    _Atomic uint64_t lease_busy0;      /* 184: busy_ns when its current lease began */
    _Atomic uint64_t lease_charged;    /* 192: charged so far in its current lease */
    uint8_t pad[56];                   /* 200 */
    _Atomic uint64_t members[RG_MAX_SLOTS / 64]; /* 256: bitmap of slots */
    uint8_t pad2[RG_TENANT_SIZE - 256 - RG_MAX_SLOTS / 8];
};

struct rg_slot {
    _Atomic uint64_t state;            /* 0: generation << 8 | SLOT_* */
    _Atomic int32_t pid;               /* 8 */
    _Atomic int32_t tenant;            /* 12 */
    uint64_t starttime;                /* 16: /proc/<pid>/stat field 22 */
    uint64_t pidns;                    /* 24: inode of /proc/self/ns/pid */
    _Atomic uint64_t mem_used;         /* 32 */
    _Atomic uint64_t busy_ns;          /* 40 */
    _Atomic uint64_t launches;         /* 48 */
    _Atomic uint64_t last_active_ns;   /* 56 */
    _Atomic uint64_t pending_until_ns; /* 64: estimated end of its queued GPU work */
    _Atomic uint64_t launched_seq;     /* 72: lease sequence it last launched under */
    _Atomic uint64_t drained_seq;      /* 80: lease sequence it last drained */
    _Atomic uint64_t mem_limit;        /* 88: its effective memory limit (env may lower); 0 as its tenant's */
    uint64_t init_ns;                  /* 96: wall time of the limiter's start-up in it */
    uint64_t init_cpu_ns;              /* 104: CPU time of the limiter's start-up in it */
    _Atomic uint64_t waited_ns;        /* 112: total time waited at the gate */
    _Atomic uint32_t waiting;          /* 120 */
    uint32_t init_lock_wait_us;        /* 124: time its registration waited on the region lock */
};

struct rg_region {
    struct rg_header h;
    struct rg_tenant t[RG_MAX_TENANTS];
    struct rg_slot s[RG_MAX_SLOTS];
};

_Static_assert(sizeof(struct rg_header) == RG_HEADER_SIZE, "header layout");
_Static_assert(sizeof(struct rg_tenant) == RG_TENANT_SIZE, "tenant layout");
_Static_assert(sizeof(struct rg_slot) == RG_SLOT_SIZE, "slot layout");
_Static_assert(sizeof(struct rg_region) == RG_TOTAL_SIZE, "region layout");
_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits");
_Static_assert(__builtin_offsetof(struct rg_header, ctx_lock_byte) == RG_CTX_LOCK_OFF, "context lock byte");

#endif
