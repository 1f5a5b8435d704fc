/*
 * Shared "GPU" of the fake driver: one file mapped by every process that loads the fake
 * libcuda.so.1 (or libnvidia-ml.so.1).  It holds the device memory accounting, the per-device
 * execution timeline (kernels run one at a time, across processes) and a log of every kernel
 * the fake GPU ran, which the tests read to measure GPU-time shares from the GPU's own
 * accounting.  Layout is fixed (tests/native/fakegpu.py mirrors it).
 */
#ifndef FAKEGPU_H
#define FAKEGPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define FG_MAGIC 0x31555047454b4146ULL /* "FAKEGPU1" */
#define FG_VERSION 1u
#define FG_MAX_DEV 4
#define FG_MAX_PROCS 4096
#define FG_LOG_ENTRIES 65536

/* Memory: the card has total_mem + reserved_mem bytes (NVML's total); CUDA programs can use
 * total_mem of them (cuDeviceTotalMem), and every context takes ctx_bytes of that, as on a real
 * GPU (FAKECUDA_MODEL, FAKECUDA_CONTEXT_BYTES, FAKECUDA_RESERVED in fakegpu_state.c). */
struct fg_dev {
    uint64_t total_mem;            /* 0: what CUDA programs can use */
    _Atomic uint64_t used_mem;     /* 8 */
    _Atomic uint64_t free_at_ns;   /* 16: the timeline is reserved up to here */
    _Atomic uint64_t busy_ns;      /* 24: GPU time of all kernels run */
    _Atomic uint64_t kernels;      /* 32 */
    uint8_t uuid[16];              /* 40 */
    char name[48];                 /* 56 */
    uint64_t reserved_mem;         /* 104: what the driver keeps of the card (NVML's "reserved") */
    uint64_t ctx_bytes;            /* 112: device memory each CUDA context costs */
    _Atomic uint64_t ooms;         /* 120: allocations the driver refused for lack of memory */
};

struct fg_proc {
    _Atomic int32_t pid;           /* 0 */
    uint32_t pad0;                 /* 4 */
    uint64_t starttime;            /* 8: /proc/<pid>/stat field 22 */
    _Atomic uint64_t mem[FG_MAX_DEV];     /* 16 */
    _Atomic uint64_t busy_ns[FG_MAX_DEV]; /* 48 */
    _Atomic uint64_t kernels;      /* 80 */
    _Atomic uint32_t ctxs[FG_MAX_DEV];    /* 88: its contexts on each device (NVML lists it there) */
    uint8_t pad[24];               /* 104 */
};

struct fg_log {
    _Atomic uint64_t seq;          /* 0: index + 1 once the entry is written */
    uint64_t start_ns;             /* 8 (CLOCK_MONOTONIC) */
    uint64_t end_ns;               /* 16 */
    int32_t pid;                   /* 24 */
    int32_t dev;                   /* 28 */
};

struct fg_state {
    uint64_t magic;                /* 0 */
    uint32_t version;              /* 8 */
    uint32_t ndev;                 /* 12 */
    _Atomic uint64_t log_head;     /* 16 */
    uint8_t pad0[40];              /* 24 */
    union {
        pthread_mutex_t lock;      /* 64: robust, process-shared */
        uint8_t lock_area[64];
    };
    struct fg_dev dev[FG_MAX_DEV];        /* 128 */
    struct fg_proc procs[FG_MAX_PROCS];   /* 640 */
    struct fg_log log[FG_LOG_ENTRIES];    /* 524928 */
};

_Static_assert(sizeof(struct fg_dev) == 128, "fg_dev layout");
_Static_assert(sizeof(struct fg_proc) == 128, "fg_proc layout");
_Static_assert(sizeof(struct fg_log) == 32, "fg_log layout");
_Static_assert(__builtin_offsetof(struct fg_state, dev) == 128, "fg_state layout");
_Static_assert(__builtin_offsetof(struct fg_state, procs) == 640, "fg_state layout");
_Static_assert(__builtin_offsetof(struct fg_state, log) == 524928, "fg_state layout");

/* fakegpu_state.c */
struct fg_state *fg_attach(void);          /* maps (creating if needed) $FAKECUDA_STATE */
int fg_proc_index(void);                    /* this process's entry, registering it */
uint64_t fg_now_ns(void);
void fg_sweep_dead(struct fg_state *st);   /* returns memory of dead processes */
void fg_lock(struct fg_state *st);         /* the state's lock (robust: a dead owner's half-made move is recounted) */
void fg_unlock(struct fg_state *st);
int fg_proc_alive(const struct fg_proc *p); /* its pid lives and is the same process (start time) */

#endif
