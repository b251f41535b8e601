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
 *
 * It needs no libc, only the kernel (all a static binary can count on from Android): its own
 * `_start`, and the kernel's calls made directly, per architecture (aarch64, x86_64, arm EABI,
 * i386), below. So every compiler that builds it (this host's cc, the NDK's clang, zig's clang)
 * compiles this one file and links nothing: `-nostdlib -ffreestanding` (devices/coapps.py CFLAGS).
 * Nothing here may make the compiler call a helper it would take from libc or compiler-rt: no
 * division (32-bit ARM may lack a divide instruction, and 64-bit division on 32-bit targets is a
 * call to __aeabi_uldivmod or __udivdi3; `udiv` below divides by shifts), and the memset/memcpy a
 * compiler may emit on its own are defined here.
 */

typedef __SIZE_TYPE__ size_t;

/* ---- the kernel's calls, per architecture (numbers: each one's unistd.h) ---- */

#if defined(__x86_64__)
enum { SYS_read = 0, SYS_write = 1, SYS_close = 3, SYS_mmap = 9, SYS_madvise = 28, SYS_nanosleep = 35,
       SYS_prctl = 157, SYS_exit_group = 231, SYS_openat = 257, SYS_ppoll = 271 };

static long syscall6(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

/* the initial stack: argc, then argv; the frame pointer 0 ends a backtrace; calls want a 16-byte
   aligned stack */
__asm__(".text\n.global _start\n.type _start,@function\n_start:\n"
        "  xor %rbp, %rbp\n  mov %rsp, %rdi\n  and $-16, %rsp\n  call start_c\n  hlt\n");

#elif defined(__aarch64__)
/* the generic table: openat (no open), ppoll (no pause), mmap */
enum { SYS_openat = 56, SYS_close = 57, SYS_read = 63, SYS_write = 64, SYS_ppoll = 73, SYS_exit_group = 94,
       SYS_nanosleep = 101, SYS_prctl = 167, SYS_mmap = 222, SYS_madvise = 233 };

static long syscall6(long n, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c,
                  x3 __asm__("x3") = d, x4 __asm__("x4") = e, x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
}

__asm__(".text\n.global _start\n.type _start,%function\n_start:\n"
        "  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n  and sp, x0, #-16\n  bl start_c\n  brk #0\n");

#elif defined(__arm__)
/* EABI: the number in r7, `svc 0`; mmap2 takes its offset in pages */
enum { SYS_read = 3, SYS_write = 4, SYS_close = 6, SYS_nanosleep = 162, SYS_prctl = 172, SYS_mmap = 192,
       SYS_madvise = 220, SYS_exit_group = 248, SYS_openat = 322, SYS_ppoll = 336 };

static long syscall6(long n, long a, long b, long c, long d, long e, long f) {
    register long r0 __asm__("r0") = a, r1 __asm__("r1") = b, r2 __asm__("r2") = c, r3 __asm__("r3") = d,
                  r4 __asm__("r4") = e, r5 __asm__("r5") = f;
    long save;
    /* r7 is Thumb code's frame pointer, which a compiler may refuse as an operand: kept, set, restored */
    __asm__ volatile("mov %1, r7\n\tmov r7, %2\n\tsvc 0\n\tmov r7, %1"
                     : "+r"(r0), "=&r"(save) : "r"(n), "r"(r1), "r"(r2), "r"(r3), "r"(r4), "r"(r5) : "memory");
    return r0;
}

/* ARM code whatever the rest is (the kernel enters it so: the entry's low bit 0), calling start_c in
   either (the linker makes a Thumb callee's bl a blx) */
__asm__(".text\n.arm\n.global _start\n.type _start,%function\n_start:\n"
        "  mov fp, #0\n  mov lr, #0\n  mov r0, sp\n  and ip, r0, #-16\n  mov sp, ip\n  bl start_c\n"
#ifdef __thumb__
        ".thumb\n"
#endif
);

#elif defined(__i386__)
/* `int $0x80`; the sixth argument goes in ebp, which the compiler may be using: pushed, loaded,
   restored (as musl does); mmap2 takes its offset in pages */
enum { SYS_read = 3, SYS_write = 4, SYS_close = 6, SYS_nanosleep = 162, SYS_prctl = 172, SYS_mmap = 192,
       SYS_madvise = 219, SYS_exit_group = 252, SYS_openat = 295, SYS_ppoll = 309 };

static long syscall6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    __asm__ volatile("pushl %7\n\tpush %%ebp\n\tmov 4(%%esp), %%ebp\n\tint $0x80\n\tpop %%ebp\n\tadd $4, %%esp"
                     : "=a"(ret) : "a"(n), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e), "g"(f) : "memory");
    return ret;
}

__asm__(".text\n.global _start\n.type _start,@function\n_start:\n"
        "  xor %ebp, %ebp\n  mov %esp, %eax\n  and $-16, %esp\n  sub $12, %esp\n  push %eax\n  call start_c\n  hlt\n");

#else
#error "bmoe-coapp: no system calls written for this architecture (aarch64, x86_64, arm, i386)"
#endif

#define AT_FDCWD (-100)
#define O_RDONLY 0
#define O_CLOEXEC 02000000
#define PROT_READ 1
#define PROT_WRITE 2
#define MAP_PRIVATE 2
#define MAP_ANONYMOUS 0x20
#define MADV_COLD 20
#define PR_SET_NAME 15
#define EINTR 4
#define ENOMEM 12

struct timespec_k { long tv_sec, tv_nsec; };   /* the kernel's own: 32-bit longs on 32-bit ABIs */

#define SYS(n, a, b, c, d, e, f) syscall6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

static __attribute__((noreturn)) void exit_group(int status) {
    for (;;)
        SYS(SYS_exit_group, status, 0, 0, 0, 0, 0);
}

/* what a compiler may call for a struct copy or a zeroing loop, even freestanding; volatile, so it
   does not make these loops into calls to themselves */
void *memset(void *dst, int c, size_t n) {
    volatile unsigned char *d = dst;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

void *memcpy(void *dst, const void *src, size_t n) {
    volatile unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

/* ---- the program ---- */

#define PAGE 4096UL
#define PAGE_SHIFT 12
#define RANDOM_PART 1365UL
#define LONG_MAX_ ((long)(~0UL >> 1))

/* n / d (d > 0) and its remainder, by shifts and subtractions: no divide instruction or helper */
static unsigned long udiv(unsigned long n, unsigned long d, unsigned long *rem) {
    unsigned long q = 0, bit = 1;
    while (d <= (n >> 1)) {
        d <<= 1;
        bit <<= 1;
    }
    for (; bit; d >>= 1, bit >>= 1) {
        if (n >= d) {
            n -= d;
            q |= bit;
        }
    }
    *rem = n;
    return q;
}

/* a line for a file descriptor, written at once */
static char line[512];
static size_t line_len;

static void put(const char *s) {
    while (*s && line_len < sizeof line)
        line[line_len++] = *s++;
}

static void put_number(unsigned long v) {
    char digits[24];
    int i = 0;
    do {
        unsigned long r;
        v = udiv(v, 10, &r);
        digits[i++] = (char)('0' + r);
    } while (v);
    while (i && line_len < sizeof line)
        line[line_len++] = digits[--i];
}

static void send(int fd) {
    const char *p = line;
    size_t left = line_len;
    while (left > 0) {
        long wrote = SYS(SYS_write, fd, p, left, 0, 0, 0);
        if (wrote == -EINTR)
            continue;
        if (wrote <= 0)
            break;
        p += wrote;
        left -= (size_t)wrote;
    }
    line_len = 0;
}

/* perror's line, with the error's number */
static __attribute__((noreturn)) void fail(const char *what, long err) {
    put("bmoe-coapp: ");
    put(what);
    put(": ");
    if (err == 0) {
        put("end of file");
    } else {
        if (err == -ENOMEM)
            put("Cannot allocate memory, ");
        put("errno ");
        put_number((unsigned long)-err);
    }
    put("\n");
    send(2);
    exit_group(1);
}

/* SIZE_BYTES: ASCII digits only, above 0, mappable (its pages counted without overflow) */
static int parse_size(const char *s, size_t *out) {
    const size_t max = ~(size_t)0 - PAGE + 1;
    size_t v = 0;
    if (!*s)
        return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        size_t d = (size_t)(*s - '0');
        if (v > max / 10 || (v == max / 10 && d > max % 10))   /* constants: folded, no division */
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return v > 0;
}

/* atol's reading (blanks, a sign, the digits up to the first other byte), saturated, not undefined,
   past LONG_MAX */
static long to_long(const char *s) {
    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    int negative = *s == '-';
    if (*s == '-' || *s == '+')
        s++;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        long d = *s - '0';
        if (v > LONG_MAX_ / 10 || (v == LONG_MAX_ / 10 && d > LONG_MAX_ % 10))   /* constants: folded */
            v = LONG_MAX_;
        else
            v = v * 10 + d;
    }
    return negative ? -v : v;
}

static void fill_random(unsigned char *p, size_t n, int urandom) {
    while (n > 0) {
        long got = SYS(SYS_read, urandom, p, n, 0, 0, 0);
        if (got == -EINTR)
            continue;
        if (got <= 0)
            fail("/dev/urandom", got);
        p += got;
        n -= (size_t)got;
    }
}

static int run(int argc, char **argv) {
    if (argc != 7) {
        put("usage: bmoe-coapp NAME SIZE_BYTES COMPRESSIBLE ACTIVE ACTIVE_PERCENT ACTIVE_PERIOD_MS\n");
        send(2);
        return 2;
    }
    size_t n;
    if (!parse_size(argv[2], &n)) {
        put("bmoe-coapp: bad size ");
        put(argv[2]);
        put("\n");
        send(2);
        return 2;
    }
    int compressible = to_long(argv[3]) == 1, active = to_long(argv[4]) == 1;
    long percent = to_long(argv[5]), period_ms = to_long(argv[6]);
    if (percent < 1 || percent > 100 || period_ms < 1) {
        put("bmoe-coapp: bad activity ");
        put(argv[5]);
        put("% every ");
        put(argv[6]);
        put(" ms\n");
        send(2);
        return 2;
    }
    SYS(SYS_prctl, PR_SET_NAME, argv[1], 0, 0, 0, 0);   /* it stays in the adb shell's process group: hung up with it */

    long mapped = SYS(SYS_mmap, 0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if ((unsigned long)mapped > -4096UL)    /* -errno */
        fail("mmap", mapped);
    unsigned char *buf = (unsigned char *)mapped;
    long urandom = SYS(SYS_openat, AT_FDCWD, "/dev/urandom", O_RDONLY | O_CLOEXEC, 0, 0, 0);
    if (urandom < 0)
        fail("/dev/urandom", urandom);
    for (size_t off = 0; off < n; off += PAGE) {
        size_t len = n - off < PAGE ? n - off : PAGE;
        if (compressible) {   /* the write makes the page; the rest of it stays zero */
            fill_random(buf + off, len < RANDOM_PART ? len : RANDOM_PART, (int)urandom);
        } else {
            fill_random(buf + off, len, (int)urandom);
        }
    }
    SYS(SYS_close, urandom, 0, 0, 0, 0, 0);
    if (!active)
        SYS(SYS_madvise, buf, n, MADV_COLD, 0, 0, 0);
    put("ready\n");
    send(1);

    unsigned long pages = (n + PAGE - 1) >> PAGE_SHIFT, ms, sec, p = 0;
    unsigned long per = udiv(pages * (unsigned long)percent, 100, &ms);
    if (per == 0)
        per = 1;
    sec = udiv((unsigned long)period_ms, 1000, &ms);
    struct timespec_k nap = {(long)sec, (long)ms * 1000000L};
    volatile unsigned char sink = 0;
    for (;;) {
        if (!active) {   /* pause(): a ppoll of nothing, without end (aarch64 has no pause) */
            SYS(SYS_ppoll, 0, 0, 0, 0, 0, 0);
            continue;
        }
        for (unsigned long i = 0; i < per; i++) {
            sink ^= buf[p << PAGE_SHIFT];
            if (++p == pages)
                p = 0;
        }
        SYS(SYS_nanosleep, &nap, 0, 0, 0, 0, 0);
    }
}

/* called by _start with the initial stack: argc, then argv's pointers (the ELF ABI of each) */
__attribute__((noreturn, used)) void start_c(long *stack) {
    exit_group(run((int)stack[0], (char **)(stack + 1)));
}
