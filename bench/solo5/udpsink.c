/*
 * udpsink for the Solo5 API alone: counts the UDP datagrams sent to IP and
 * PORT on net device "service0" and checks their payload pattern, as
 * guests/udpsink.c does, but with nothing of pyvmm's: Solo5's solo5.h, its
 * toolchain, and whichever bindings the link picks.  scripts/solo5_build.py
 * compiles it once with x86_64-solo5-none-static-cc and links that one
 * object three ways: -z solo5-abi=pyvmm (pyvmm's runtime: shmstream rings),
 * -z solo5-abi=hvt (Solo5's own bindings: hypercalls or Solo5's ring I/O)
 * and -z solo5-abi=spt (a seccomp-sandboxed process under solo5-spt), so
 * bench/pps.py compares tenders and bindings on the same program.
 *
 *   udpsink IP PORT [any] [EXPECTED [IDLE_MS]]
 *
 * The pattern, the end condition and the report are guests/udpsink.c's:
 * bytes 0-7 of a payload are a little-endian sequence number s, byte i is
 * (s + i) & 0xff; it ends after EXPECTED datagrams (EXPECTED > 0) or IDLE_MS
 * (default 2000) without one after the first.  Each frame's IPv4 header and
 * UDP checksums are verified.  Every waiting frame is read (solo5_net_read,
 * one copy into our buffer) before the next solo5_yield; ARP requests for
 * IP are answered.  Output: "ready: ...", then frames, bytes,
 * pattern_errors, out_of_order, elapsed_us (first to last datagram),
 * batches, max_batch, bad_checksum, and SUCCESS (exit 0) or FAILURE (1).
 *
 * Like any Solo5 program it brings its own mem* functions.
 */
#include "solo5.h"

#define USAGE "FAILURE: usage: udpsink IP PORT [any] [EXPECTED [IDLE_MS]]\n"
#define ETH_HLEN 14
#define IPV4_HLEN 20
#define UDP_HLEN 8
/* The largest frame we take: a 9000-byte MTU and its Ethernet header. */
#define FRAME_MAX (9000 + ETH_HLEN)

void *memcpy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

void *memset(void *dst, int c, size_t n)
{
    uint8_t *d = dst;
    while (n--)
        *d++ = (uint8_t)c;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y)
            return *x - *y;
    return 0;
}

/* -- output ----------------------------------------------------------------- */

static void say(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    solo5_console_write(s, n);
}

static void say_number(uint64_t v)
{
    char digits[21];
    int i = 20;
    digits[i] = '\0';
    do {
        digits[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    say(&digits[i]);
}

static void say_field(const char *name, uint64_t v)
{
    say(name);
    say(": ");
    say_number(v);
    say("\n");
}

/* -- the command line ----------------------------------------------------------- */

static const char *skip_spaces(const char *p)
{
    while (*p == ' ')
        p++;
    return p;
}

/* A decimal number of at most 19 digits; false if there is none. */
static bool parse_number(const char **s, uint64_t *out)
{
    const char *p = *s;
    uint64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (++digits > 19)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (digits == 0)
        return false;
    *s = p;
    *out = v;
    return true;
}

static bool parse_ip(const char **s, uint8_t ip[4])
{
    const char *p = *s;
    for (int i = 0; i < 4; i++) {
        uint64_t v;
        if (!parse_number(&p, &v) || v > 255)
            return false;
        ip[i] = (uint8_t)v;
        if (i < 3 && *p++ != '.')
            return false;
    }
    *s = p;
    return true;
}

/* -- the wire ------------------------------------------------------------------- */

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/*
 * RFC 1071's one's complement sum, kept in the CPU's byte order: 32-bit
 * loads into a 64-bit accumulator (no carry lost at any frame size); the
 * sum of byte-swapped words is the byte-swapped sum, so sum_fold swaps once.
 */
typedef uint32_t __attribute__((aligned(1), may_alias)) u32_unaligned;
typedef uint16_t __attribute__((aligned(1), may_alias)) u16_unaligned;

static uint64_t sum_add(uint64_t sum, const uint8_t *p, size_t len)
{
    for (; len >= 4; p += 4, len -= 4)
        sum += *(const u32_unaligned *)p;
    if (len >= 2) {
        sum += *(const u16_unaligned *)p;
        p += 2;
        len -= 2;
    }
    if (len)
        sum += p[0];
    return sum;
}

/* Zero for a header or datagram whose checksum is right. */
static uint16_t sum_fold(uint64_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    uint16_t v = (uint16_t)sum;
    return (uint16_t)~(uint16_t)(v << 8 | v >> 8);
}

struct sink {
    uint8_t mac[6], ip[4];
    uint64_t port;
    bool check; /* the payload pattern (not with `any`) */
    uint64_t frames, bytes, pattern_errors, out_of_order, bad_checksum;
    uint64_t last_seq;
    solo5_time_t first, last;
};

/* An ARP request for our IP turned into its reply in place: its length, or 0. */
static size_t arp_reply(const struct sink *k, uint8_t *f, size_t len)
{
    uint8_t *a = f + ETH_HLEN;
    if (len < ETH_HLEN + 28 || get16(a) != 1 || get16(a + 2) != 0x0800 ||
            a[4] != 6 || a[5] != 4 || get16(a + 6) != 1 ||
            memcmp(a + 24, k->ip, 4) != 0)
        return 0;
    put16(a + 6, 2);
    memcpy(a + 18, a + 8, 10); /* the asker's MAC and IP become the target */
    memcpy(a + 8, k->mac, 6);
    memcpy(a + 14, k->ip, 4);
    memcpy(f, a + 18, 6);
    memcpy(f + 6, k->mac, 6);
    return ETH_HLEN + 28;
}

static void count_payload(struct sink *k, const uint8_t *p, size_t len)
{
    solo5_time_t now = solo5_clock_monotonic();

    if (k->frames == 0)
        k->first = now;
    k->last = now;
    k->frames++;
    k->bytes += len;
    if (!k->check)
        return;
    if (len < 8) {
        k->pattern_errors++;
        return;
    }
    uint64_t s = 0;
    for (int i = 7; i >= 0; i--)
        s = s << 8 | p[i];
    if (k->frames > 1 && s <= k->last_seq)
        k->out_of_order++;
    k->last_seq = s;
    uint8_t expect = (uint8_t)(s + 8);
    for (size_t i = 8; i < len; i++, expect++) {
        if (p[i] != expect) {
            k->pattern_errors++;
            return;
        }
    }
}

/* One IPv4 UDP datagram to us and PORT, its checksums right: counted. */
static void take_ipv4(struct sink *k, const uint8_t *f, size_t len)
{
    const uint8_t *h = f + ETH_HLEN;
    if (memcmp(f, k->mac, 6) != 0 && !(f[0] & 1))
        return;
    if (len < ETH_HLEN + IPV4_HLEN || (h[0] >> 4) != 4)
        return;
    size_t hlen = (size_t)(h[0] & 15) * 4, total = get16(h + 2);
    if (hlen < IPV4_HLEN || total < hlen || ETH_HLEN + total > len)
        return;
    if (sum_fold(sum_add(0, h, hlen)) != 0 || memcmp(h + 16, k->ip, 4) != 0)
        return;
    if ((get16(h + 6) & 0x3fff) != 0 || h[9] != 17 || total - hlen < UDP_HLEN)
        return; /* a fragment, or not UDP */
    const uint8_t *u = h + hlen;
    size_t ulen = get16(u + 4);
    if (ulen < UDP_HLEN || ulen > total - hlen)
        return;
    if (get16(u + 6) != 0) {
        uint8_t pseudo[12];
        memcpy(pseudo, h + 12, 8);
        pseudo[8] = 0;
        pseudo[9] = 17;
        put16(pseudo + 10, (uint16_t)ulen);
        if (sum_fold(sum_add(sum_add(0, pseudo, 12), u, ulen)) != 0) {
            k->bad_checksum++;
            return;
        }
    }
    if (get16(u + 2) == k->port)
        count_payload(k, u + UDP_HLEN, ulen - UDP_HLEN);
}

static uint8_t frame[FRAME_MAX];

int solo5_app_main(const struct solo5_start_info *si)
{
    static struct sink k;
    const char *p = skip_spaces(si->cmdline);
    uint64_t expected = 0, idle_ms = 2000;

    if (!parse_ip(&p, k.ip) || *p != ' ')
        goto usage;
    p = skip_spaces(p);
    if (!parse_number(&p, &k.port) || k.port > 65535)
        goto usage;
    p = skip_spaces(p);
    k.check = true;
    if (p[0] == 'a' && p[1] == 'n' && p[2] == 'y' && (p[3] == ' ' || p[3] == '\0')) {
        k.check = false;
        p = skip_spaces(p + 3);
    }
    if (*p != '\0' && !parse_number(&p, &expected))
        goto usage;
    p = skip_spaces(p);
    if (*p != '\0' && (!parse_number(&p, &idle_ms) || idle_ms == 0 ||
                       idle_ms > 86400000))
        goto usage;
    if (*skip_spaces(p) != '\0')
        goto usage;

    solo5_handle_t h;
    struct solo5_net_info info;
    if (solo5_net_acquire("service0", &h, &info) != SOLO5_R_OK) {
        say("FAILURE: cannot acquire net device \"service0\"\n");
        return SOLO5_EXIT_FAILURE;
    }
    memcpy(k.mac, info.mac_address, 6);
    size_t frame_size = info.mtu + ETH_HLEN;
    if (frame_size > FRAME_MAX)
        frame_size = FRAME_MAX;
    say("ready: counting UDP to port ");
    say_number(k.port);
    if (expected != 0) {
        say(", until ");
        say_number(expected);
        say(" datagrams");
    }
    say(" or ");
    say_number(idle_ms);
    say(k.check ? " ms idle, checking the test pattern\n" : " ms idle, any payload\n");

    uint64_t batches = 0, max_batch = 0;
    const solo5_time_t idle_ns = idle_ms * 1000000ULL;
    for (;;) {
        uint64_t n = 0;
        for (;;) {
            size_t len = 0;
            solo5_result_t r = solo5_net_read(h, frame, frame_size, &len);
            if (r == SOLO5_R_AGAIN)
                break;
            if (r != SOLO5_R_OK) {
                say("FAILURE: solo5_net_read failed\n");
                return SOLO5_EXIT_FAILURE;
            }
            n++;
            if (len >= ETH_HLEN && get16(frame + 12) == 0x0806) {
                size_t out = arp_reply(&k, frame, len);
                if (out != 0)
                    solo5_net_write(h, frame, out);
            } else if (len >= ETH_HLEN && get16(frame + 12) == 0x0800) {
                take_ipv4(&k, frame, len);
            }
            if (expected != 0 && k.frames >= expected)
                break;
        }
        if (n != 0) {
            batches++;
            if (n > max_batch)
                max_batch = n;
        }
        if (expected != 0 && k.frames >= expected)
            break;
        solo5_time_t now = solo5_clock_monotonic(), deadline;
        if (k.frames == 0) {
            deadline = now + 1000000000ULL;
        } else {
            deadline = k.last + idle_ns;
            if (now >= deadline)
                break;
        }
        solo5_handle_set_t ready = 0;
        solo5_yield(deadline, &ready);
    }

    say_field("frames", k.frames);
    say_field("bytes", k.bytes);
    say_field("pattern_errors", k.pattern_errors);
    say_field("out_of_order", k.out_of_order);
    say_field("elapsed_us", (k.last - k.first) / 1000);
    say_field("batches", batches);
    say_field("max_batch", max_batch);
    say_field("bad_checksum", k.bad_checksum);
    if (k.pattern_errors != 0) {
        say("FAILURE: pattern errors (the test pattern: a little-endian 64-bit "
            "sequence number s, then byte i = (s + i) & 0xff; `any` after PORT "
            "counts any UDP)\n");
        return SOLO5_EXIT_FAILURE;
    }
    say("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;

usage:
    say(USAGE);
    return SOLO5_EXIT_FAILURE;
}
