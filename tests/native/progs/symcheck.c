/*
 * symcheck: for each name, which library a program ends up calling, by each way of reaching
 * the driver.  Prints "<how> <name> <library basename or NULL>".
 *   symcheck NAME...
 */
#define _GNU_SOURCE
#include "gpuops_cuda.h"

#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>

static const char *owner(void *p) {
    Dl_info info;
    if (!p) return "NULL";
    if (!dladdr(p, &info) || !info.dli_fname) return "?";
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s", info.dli_fname);
    return basename(buf);
}

int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 1;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    init(0);
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
    printf("dlsym cuGetProcAddress_v2 %s\n", owner((void *)gpa));
    for (int i = 1; i < argc; i++) {
        printf("dlsym %s %s\n", argv[i], owner(dlsym(h, argv[i])));
        printf("next %s %s\n", argv[i], owner(dlsym(RTLD_NEXT, argv[i])));
        printf("default %s %s\n", argv[i], owner(dlsym(RTLD_DEFAULT, argv[i])));
        for (int ptsz = 0; ptsz < 2; ptsz++) {
            void *p = NULL;
            CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            char name[128];
            snprintf(name, sizeof name, "%s", argv[i]);
            char *v = strstr(name, "_v2");
            if (v && !v[3]) *v = 0; /* cuGetProcAddress takes names without the version suffix */
            CUresult r = gpa(name, &p, 12040, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
            printf("procaddr%s %s %s %d %d\n", ptsz ? "_ptsz" : "", argv[i], owner(p), r, (int)st);
        }
    }
    return 0;
}
