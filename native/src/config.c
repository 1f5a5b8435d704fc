/*
 * Configuration: the node's tenant table (written by the agent) and the environment, which can
 * only lower what the table allows.
 *
 * Tenant table, <dir>/tenants, one directive per line, '#' starts a comment:
 *
 *   gpuops-limiter-table 1
 *   generation 42
 *   tenant team-a memory=8589934592 compute=30% policy=fixed-share class=online
 *   tenant team-b memory=16GiB compute=70 policy=burst-share class=offline gpus=0,GPU-8f2c...
 *   tenant * memory=1GiB compute=5 policy=fixed-share
 *
 * "tenant *" applies to tenants that have no line of their own.  A line with gpus= applies to
 * those GPUs (index or UUID) and wins over a line without.  memory=0 is a cap of zero (every
 * allocation refused); no memory= is no cap.  Anything malformed rejects the whole file, and so
 * does a last line without its newline (a file caught half-written): the library then keeps the
 * last good table, or fails closed (hooks.c).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 4096

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= RG_NAME_LEN) return 0;
    if (!strcmp(s, "*")) return 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.')) return 0;
    }
    return 1;
}

static int parse_policy(const char *v) {
    if (!strcmp(v, "fixed-share")) return POLICY_FIXED;
    if (!strcmp(v, "burst-share")) return POLICY_BURST;
    if (!strcmp(v, "best-effort")) return POLICY_BEST_EFFORT;
    return -1;
}

static int parse_class(const char *v) {
    if (!strcmp(v, "online")) return CLASS_ONLINE;
    if (!strcmp(v, "offline")) return CLASS_OFFLINE;
    return -1;
}

static int fail(char *err, size_t n, int line, const char *what) {
    snprintf(err, n, "line %d: %s", line, what);
    return -1;
}

int gl_table_parse(const char *text, size_t len, struct gl_table *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (memchr(text, 0, len)) return fail(err, errlen, 0, "binary data");
    char *copy = malloc(len + 1);
    if (!copy) return fail(err, errlen, 0, "out of memory");
    memcpy(copy, text, len);
    copy[len] = 0;
    struct gl_table t = {0, 0, calloc(MAX_ENTRIES, sizeof(struct gl_table_entry))};
    if (!t.e) {
        free(copy);
        return fail(err, errlen, 0, "out of memory");
    }
    int lineno = 0, have_header = 0, have_gen = 0, rc = 0;
    if (len && text[len - 1] != '\n') {
        int lines = 1;
        for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
        free(copy);
        free(t.e);
        return fail(err, errlen, lines, "last line incomplete (no newline): truncated");
    }
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok_save = NULL;
        char *w = strtok_r(line, " \t\r", &tok_save);
        if (!w) continue;
        if (!have_header) {
            char *v = strtok_r(NULL, " \t\r", &tok_save);
            if (strcmp(w, "gpuops-limiter-table") != 0 || !v || strcmp(v, "1") != 0 || strtok_r(NULL, " \t\r", &tok_save)) {
                rc = fail(err, errlen, lineno, "expected header 'gpuops-limiter-table 1'");
                break;
            }
            have_header = 1;
            continue;
        }
        if (!strcmp(w, "generation")) {
            char *v = strtok_r(NULL, " \t\r", &tok_save);
            char *end;
            if (!v || !isdigit((unsigned char)*v)) { rc = fail(err, errlen, lineno, "bad generation"); break; }
            t.generation = strtoull(v, &end, 10);
            if (*end || strtok_r(NULL, " \t\r", &tok_save) || have_gen) { rc = fail(err, errlen, lineno, "bad generation"); break; }
            have_gen = 1;
            continue;
        }
        if (strcmp(w, "tenant") != 0) { rc = fail(err, errlen, lineno, "unknown directive"); break; }
        char *name = strtok_r(NULL, " \t\r", &tok_save);
        if (!name || !valid_name(name)) { rc = fail(err, errlen, lineno, "bad tenant name"); break; }
        if (t.n >= MAX_ENTRIES) { rc = fail(err, errlen, lineno, "too many tenants"); break; }
        struct gl_table_entry *e = &t.e[t.n];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", name);
        e->cfg.mem_limit = GL_MEM_NONE;
        e->cfg.policy = -1;
        e->cfg.klass = CLASS_ONLINE;
        double share = -1;
        for (char *kv = strtok_r(NULL, " \t\r", &tok_save); kv && !rc; kv = strtok_r(NULL, " \t\r", &tok_save)) {
            char *eq = strchr(kv, '=');
            if (!eq || eq == kv || !eq[1]) { rc = fail(err, errlen, lineno, "expected key=value"); break; }
            *eq = 0;
            const char *k = kv, *v = eq + 1;
            if (!strcmp(k, "memory")) {
                if (gl_parse_bytes(v, &e->cfg.mem_limit) != 0) rc = fail(err, errlen, lineno, "bad memory");
            } else if (!strcmp(k, "compute")) {
                if (gl_parse_percent(v, &share) != 0) rc = fail(err, errlen, lineno, "bad compute");
            } else if (!strcmp(k, "policy")) {
                if ((e->cfg.policy = parse_policy(v)) < 0) rc = fail(err, errlen, lineno, "bad policy");
            } else if (!strcmp(k, "class")) {
                if ((e->cfg.klass = parse_class(v)) < 0) rc = fail(err, errlen, lineno, "bad class");
            } else if (!strcmp(k, "gpus")) {
                if (strlen(v) >= sizeof e->gpus) rc = fail(err, errlen, lineno, "gpus list too long");
                else snprintf(e->gpus, sizeof e->gpus, "%s", v);
            } else {
                rc = fail(err, errlen, lineno, "unknown key");
            }
        }
        if (rc) break;
        if (share > 0) e->cfg.share_permille = (uint32_t)(share * 10.0 + 0.5);
        if (e->cfg.policy < 0) e->cfg.policy = e->cfg.share_permille ? POLICY_FIXED : POLICY_BEST_EFFORT;
        if (e->cfg.policy != POLICY_BEST_EFFORT && !e->cfg.share_permille) {
            rc = fail(err, errlen, lineno, "fixed-share and burst-share need compute=");
            break;
        }
        if (e->cfg.policy == POLICY_BEST_EFFORT) e->cfg.share_permille = 0;
        for (int i = 0; i < t.n; i++) {
            if (!strcmp(t.e[i].name, e->name) && !strcmp(t.e[i].gpus, e->gpus)) {
                rc = fail(err, errlen, lineno, "duplicate tenant line");
                break;
            }
        }
        if (rc) break;
        t.n++;
    }
    free(copy);
    if (!rc && !have_header) rc = fail(err, errlen, lineno, "empty table (no header)");
    if (rc) {
        free(t.e);
        return -1;
    }
    *out = t;
    return 0;
}

void gl_table_free(struct gl_table *t) {
    free(t->e);
    memset(t, 0, sizeof *t);
}

static int gpus_match(const char *list, int index, const char *uuid) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *g = strtok_r(buf, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        if (uuid && *uuid && !strcasecmp(g, uuid)) return 1;
        char *end;
        long v = strtol(g, &end, 10);
        if (!*end && end != g && v == index) return 1;
    }
    return 0;
}

int gl_table_lookup(const struct gl_table *t, const char *tenant, int index, const char *uuid, struct gl_cfg *out) {
    const char *names[2] = {tenant, "*"};
    int managed = 0;
    for (int pass = 0; pass < 2; pass++) {
        const struct gl_table_entry *any = NULL, *specific = NULL;
        for (int i = 0; i < t->n; i++) {
            const struct gl_table_entry *e = &t->e[i];
            int applies = !e->gpus[0] || gpus_match(e->gpus, index, uuid);
            managed |= applies;
            if (!applies || strcmp(e->name, names[pass]) != 0) continue;
            if (!e->gpus[0]) any = e;
            else if (!specific) specific = e;
        }
        if (specific || any) {
            *out = (specific ? specific : any)->cfg;
            return 1;
        }
    }
    return managed ? -1 : 0;
}

struct gl_cfg gl_cfg_closed(void) {
    struct gl_cfg c = {.mem_limit = 0, .share_permille = 10, .policy = POLICY_FIXED, .klass = CLASS_OFFLINE};
    return c;
}

/* ------------------------------------------------------------------ environment */
static int env_bytes(const char *name, uint64_t *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (gl_parse_bytes(v, out) != 0 || *out == 0) {
        GL_LOG(LOG_WARN, "ignoring %s=%s: not a size", name, v);
        return 0;
    }
    return 1;
}

static int env_share(const char *name, double *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    double p;
    if (gl_parse_percent(v, &p) != 0) {
        GL_LOG(LOG_WARN, "ignoring %s=%s: not a percentage", name, v);
        return 0;
    }
    if (p <= 0 || p >= 100) return 0; /* HAMi-core: 0 and 100 mean no limit */
    *out = p;
    return 1;
}

void gl_env_read(struct gl_env *env) {
    memset(env, 0, sizeof *env);
    env->share_all = -1;
    env->policy = -1;
    env->klass = -1;
    uint64_t b;
    double p;
    /* gpuops names first, then HAMi-core's; the lower of the two wins */
    const char *mem_names[] = {"GPUOPS_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"};
    const char *share_names[] = {"GPUOPS_COMPUTE_SHARE", "CUDA_DEVICE_SM_LIMIT"};
    for (int k = 0; k < 2; k++) {
        if (env_bytes(mem_names[k], &b) && (!env->mem_limit_all || b < env->mem_limit_all)) env->mem_limit_all = b;
        if (env_share(share_names[k], &p) && (env->share_all < 0 || p < env->share_all)) env->share_all = p;
    }
    for (int i = 0; i < GL_MAX_DEV; i++) {
        env->share_dev[i] = -1;
        char name[64];
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "%s_%d", mem_names[k], i);
            if (env_bytes(name, &b) && (!env->mem_limit_dev[i] || b < env->mem_limit_dev[i])) env->mem_limit_dev[i] = b;
            snprintf(name, sizeof name, "%s_%d", share_names[k], i);
            if (env_share(name, &p) && (env->share_dev[i] < 0 || p < env->share_dev[i])) env->share_dev[i] = p;
        }
    }
    const char *v = getenv("GPUOPS_POLICY");
    if (v && *v && (env->policy = parse_policy(v)) < 0) GL_LOG(LOG_WARN, "ignoring GPUOPS_POLICY=%s", v);
    v = getenv("GPUOPS_CLASS");
    if (v && *v && (env->klass = parse_class(v)) < 0) GL_LOG(LOG_WARN, "ignoring GPUOPS_CLASS=%s", v);
}

struct gl_cfg gl_cfg_lower(const struct gl_cfg *table, int found, const struct gl_env *env, int dev) {
    struct gl_cfg c = {.mem_limit = GL_MEM_NONE, .share_permille = 0, .policy = POLICY_BEST_EFFORT, .klass = CLASS_ONLINE};
    if (found) c = *table;
    uint64_t mem = (dev >= 0 && dev < GL_MAX_DEV && env->mem_limit_dev[dev]) ? env->mem_limit_dev[dev] : env->mem_limit_all;
    if (mem && mem < c.mem_limit) c.mem_limit = mem;
    double share = (dev >= 0 && dev < GL_MAX_DEV && env->share_dev[dev] >= 0) ? env->share_dev[dev] : env->share_all;
    if (!found) {
        /* No line in the table for this tenant (ad-hoc use): the environment describes it. */
        if (share > 0) {
            c.share_permille = (uint32_t)(share * 10.0 + 0.5);
            c.policy = env->policy >= 0 ? env->policy : POLICY_FIXED;
        } else if (env->policy == POLICY_FIXED || env->policy == POLICY_BURST) {
            GL_LOG(LOG_WARN, "GPUOPS_POLICY needs GPUOPS_COMPUTE_SHARE; ignored");
        }
        if (c.policy == POLICY_BEST_EFFORT) c.share_permille = 0;
        if (env->klass >= 0) c.klass = env->klass;
        return c;
    }
    /* The table has a line: the environment may only make it stricter. */
    if (share > 0) {
        uint32_t pm = (uint32_t)(share * 10.0 + 0.5);
        if (c.policy == POLICY_BEST_EFFORT) {
            c.policy = POLICY_FIXED;
            c.share_permille = pm;
        } else if (pm < c.share_permille) {
            c.share_permille = pm;
        }
    }
    if (env->policy == POLICY_FIXED && c.policy == POLICY_BURST) c.policy = POLICY_FIXED;
    if (env->klass == CLASS_OFFLINE) c.klass = CLASS_OFFLINE;
    return c;
}
