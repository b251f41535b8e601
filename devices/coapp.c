/* bmoe-coapp: another open app on a phone, for a campaign's `apps` axis (devices/coapps.py).
 *
 *   bmoe-coapp NAME SIZE_BYTES COMPRESSIBLE ACTIVE ACTIVE_PERCENT ACTIVE_PERIOD_MS
 *
 * Names itself NAME (its comm, what lmkd's kill line shows), maps
 * SIZE_BYTES of anonymous memory and fills it: random bytes zram cannot compress, or (COMPRESSIBLE
 * 1) pages of one third random bytes and two thirds zeros, which lz4 stores in about a third (the
 * pattern devices/virtual/apps.py gives a virtual phone's own apps). Then, as an app the user is in
 * (ACTIVE 1), it reads one byte of ACTIVE_PERCENT % of its pages every ACTIVE_PERIOD_MS in turn;
 * otherwise it marks the memory cold (MADV_COLD, what the LRU makes of an app left alone) and
 * sleeps. It prints "ready" once the memory is held, then runs until killed. Its oom_score_adj is
 * the one its parent shell wrote before exec (devices/base.py at_oom_score_adj).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_COLD
#define MADV_COLD 20
#endif

#define PAGE 4096UL
#define RANDOM_PART 1365UL

static void fill_random(unsigned char *p, size_t n, int urandom) {
    while (n > 0) {
        ssize_t got = read(urandom, p, n);
        if (got <= 0) {
            perror("bmoe-coapp: /dev/urandom");
            exit(1);
        }
        p += got;
        n -= (size_t)got;
    }
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bmoe-coapp NAME SIZE_BYTES COMPRESSIBLE ACTIVE ACTIVE_PERCENT ACTIVE_PERIOD_MS\n");
        return 2;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long size = strtoull(argv[2], &end, 10);
    if (errno || *end || size == 0) {
        fprintf(stderr, "bmoe-coapp: bad size %s\n", argv[2]);
        return 2;
    }
    int compressible = atoi(argv[3]) == 1, active = atoi(argv[4]) == 1;
    long percent = atol(argv[5]), period_ms = atol(argv[6]);
    if (percent < 1 || percent > 100 || period_ms < 1) {
        fprintf(stderr, "bmoe-coapp: bad activity %s%% every %s ms\n", argv[5], argv[6]);
        return 2;
    }
    prctl(PR_SET_NAME, argv[1], 0, 0, 0);   /* it stays in the adb shell's process group: hung up with it */

    size_t n = (size_t)size;
    unsigned char *buf = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        perror("bmoe-coapp: mmap");
        return 1;
    }
    int urandom = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (urandom < 0) {
        perror("bmoe-coapp: /dev/urandom");
        return 1;
    }
    for (size_t off = 0; off < n; off += PAGE) {
        size_t len = n - off < PAGE ? n - off : PAGE;
        if (compressible) {   /* the write makes the page; the rest of it stays zero */
            fill_random(buf + off, len < RANDOM_PART ? len : RANDOM_PART, urandom);
        } else {
            fill_random(buf + off, len, urandom);
        }
    }
    close(urandom);
    if (!active)
        madvise(buf, n, MADV_COLD);
    printf("ready\n");
    fflush(stdout);

    size_t pages = (n + PAGE - 1) / PAGE, per = pages * (size_t)percent / 100, p = 0;
    if (per == 0)
        per = 1;
    struct timespec nap = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    volatile unsigned char sink = 0;
    for (;;) {
        if (!active) {
            pause();
            continue;
        }
        for (size_t i = 0; i < per; i++) {
            sink ^= buf[p * PAGE];
            p = (p + 1) % pages;
        }
        nanosleep(&nap, NULL);
    }
}
