/* Takes a region's robust mutex and keeps it (until killed): lets the tests kill or stop the
 * owner of the lock at a moment of their choosing.   lockholder REGION_FILE */
#define _GNU_SOURCE
#include "region.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) return 1;
    struct rg_region *rg = mmap(NULL, RG_TOTAL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rg == MAP_FAILED) return 1;
    int rc = pthread_mutex_lock(&rg->h.lock);
    printf("locked %d\n", rc);
    fflush(stdout);
    for (;;) pause();
}
