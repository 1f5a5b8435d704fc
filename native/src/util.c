/* Logging, time and parsing helpers. */
#define _GNU_SOURCE
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int gl_log_level = LOG_WARN;
static int g_log_fd = 2;

void gl_log_init(void) {
    const char *lv = getenv("GPUOPS_LOG_LEVEL");
    if (!lv || !*lv) lv = getenv("LIBCUDA_LOG_LEVEL"); /* HAMi-core's name */
    if (lv && *lv) {
        int v = atoi(lv);
        if (v >= LOG_NONE && v <= LOG_DEBUG) gl_log_level = v;
    }
    const char *f = getenv("GPUOPS_LOG_FILE");
    if (f && *f) {
        int fd = open(f, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) g_log_fd = fd;
    }
}

void gl_log_impl(int level, struct gl_ratelimit *rl, const char *fmt, ...) {
    static const char *names[] = {"", "error", "warning", "info", "debug"};
    uint64_t now = gl_now_ns();
    uint64_t window = now / 10000000000ull; /* 10 s windows */
    uint64_t w = atomic_load(&rl->window);
    uint32_t dropped = 0;
    if (w != window && atomic_compare_exchange_strong(&rl->window, &w, window)) {
        atomic_store(&rl->count, 0);
        dropped = atomic_exchange(&rl->dropped, 0);
    }
    if (atomic_fetch_add(&rl->count, 1) >= 5) {
        atomic_fetch_add(&rl->dropped, 1);
        return;
    }
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "gpuops-limiter[%d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 40) n = (int)sizeof buf - 40;
    if (dropped) n += snprintf(buf + n, sizeof buf - (size_t)n, " (%u similar suppressed)", dropped);
    buf[n++] = '\n';
    ssize_t wr = write(g_log_fd, buf, (size_t)n);
    (void)wr;
}

uint64_t gl_thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t gl_proc_starttime(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    int field = 2;
    for (; *p; p++) {
        if (*p == ' ' && ++field == 22) return strtoull(p + 1, NULL, 10);
    }
    return 0;
}

uint64_t gl_pidns(void) {
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) return 0;
    return (uint64_t)st.st_ino;
}

/* "8GiB", "512M", "1.5g", "1000000": binary for single letters and *iB, decimal for KB/MB/GB/TB. */
int gl_parse_bytes(const char *s, uint64_t *out) {
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    while (isspace((unsigned char)*end)) end++;
    char unit[8] = {0};
    size_t ul = 0;
    while (*end && !isspace((unsigned char)*end) && ul < sizeof unit - 1) unit[ul++] = (char)tolower((unsigned char)*end++);
    while (isspace((unsigned char)*end)) end++;
    if (*end) return -1;
    double f;
    if (!ul || !strcmp(unit, "b")) f = 1;
    else if (!strcmp(unit, "k") || !strcmp(unit, "kib")) f = 1024.0;
    else if (!strcmp(unit, "m") || !strcmp(unit, "mib")) f = 1048576.0;
    else if (!strcmp(unit, "g") || !strcmp(unit, "gib")) f = 1073741824.0;
    else if (!strcmp(unit, "t") || !strcmp(unit, "tib")) f = 1099511627776.0;
    else if (!strcmp(unit, "kb")) f = 1e3;
    else if (!strcmp(unit, "mb")) f = 1e6;
    else if (!strcmp(unit, "gb")) f = 1e9;
    else if (!strcmp(unit, "tb")) f = 1e12;
    else return -1;
    double r = v * f;
    if (r >= 1.8e19) return -1;
    *out = (uint64_t)r;
    return 0;
}

int gl_parse_percent(const char *s, double *out) {
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s) return -1;
    if (*end == '%') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end || v < 0 || v > 100) return -1;
    *out = v;
    return 0;
}
