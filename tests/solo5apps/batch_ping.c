/*
 * A Solo5 program that answers ARP and ICMP echo requests for 10.0.0.2 with
 * the optional calls of solo5_net_batch.h: every waiting frame is read in
 * place (solo5_net_read_zc), turned into its reply where it lies, queued
 * (solo5_net_queue) and given back (solo5_net_read_done); one
 * solo5_net_flush per drained batch.  Built with Solo5's toolchain and
 * linked with -z solo5-abi=pyvmm by tests/test_solo5_bindings.py.
 *
 *     batch_ping COUNT    answer COUNT echo requests, then print SUCCESS
 *
 * Like any Solo5 program it brings its own mem* functions (the compiler may
 * call them); everything else is Solo5's API.
 */
#include "solo5.h"
#include "solo5_net_batch.h"

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

static size_t length(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

static void say(const char *s)
{
    solo5_console_write(s, length(s));
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

static const uint8_t our_ip[4] = { 10, 0, 0, 2 };
static uint8_t our_mac[6];

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* The Internet checksum of n bytes (RFC 1071). */
static uint16_t checksum(const uint8_t *p, size_t n)
{
    uint32_t sum = 0;
    for (; n > 1; n -= 2, p += 2)
        sum += get16(p);
    if (n)
        sum += (uint32_t)p[0] << 8;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

static void swap(uint8_t *a, uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

/* Turn an ARP request for our address into its reply, in place. */
static int arp_reply(uint8_t *f, size_t len)
{
    uint8_t *a = f + 14;
    if (len < 42 || get16(a) != 1 || get16(a + 2) != 0x0800 || get16(a + 6) != 1 ||
            memcmp(a + 24, our_ip, 4) != 0)
        return 0;
    put16(a + 6, 2);
    memcpy(a + 18, a + 8, 10);      /* target = the asker (MAC and IP) */
    memcpy(a + 8, our_mac, 6);      /* sender = us */
    memcpy(a + 14, our_ip, 4);
    memcpy(f, a + 18, 6);
    memcpy(f + 6, our_mac, 6);
    return 1;
}

/* Turn an ICMP echo request to us into its reply, in place. */
static int echo_reply(uint8_t *f, size_t len)
{
    uint8_t *ip = f + 14;
    if (len < 14 + 20 + 8 || (ip[0] >> 4) != 4 || memcmp(f, our_mac, 6) != 0)
        return 0;
    size_t ihl = (size_t)(ip[0] & 15) * 4, total = get16(ip + 2);
    if (ihl < 20 || total < ihl + 8 || 14 + total > len || ip[9] != 1 ||
            memcmp(ip + 16, our_ip, 4) != 0 || checksum(ip, ihl) != 0)
        return 0;
    uint8_t *icmp = ip + ihl;
    if (icmp[0] != 8 || checksum(icmp, total - ihl) != 0)
        return 0;
    swap(f, f + 6, 6);
    swap(ip + 12, ip + 16, 4);
    ip[8] = 64;
    put16(ip + 10, 0);
    put16(ip + 10, checksum(ip, ihl));
    icmp[0] = 0;
    put16(icmp + 2, 0);
    put16(icmp + 2, checksum(icmp, total - ihl));
    return 1;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t want = 0;
    for (const char *p = si->cmdline; *p >= '0' && *p <= '9'; p++)
        want = want * 10 + (uint64_t)(*p - '0');
    if (want == 0) {
        say("usage: batch_ping COUNT\n");
        return SOLO5_EXIT_FAILURE;
    }
    struct solo5_net_info info;
    solo5_handle_t h;
    if (solo5_net_acquire("service0", &h, &info) != SOLO5_R_OK) {
        say("FAILURE: no net device service0\n");
        return SOLO5_EXIT_FAILURE;
    }
    memcpy(our_mac, info.mac_address, 6);
    say("ready\n");

    uint64_t echoes = 0, batches = 0, largest = 0, full = 0;
    while (echoes < want) {
        solo5_handle_set_t ready = 0;
        solo5_yield(solo5_clock_monotonic() + 1000000000ULL, &ready);
        if (!(ready & (1ULL << h)))
            continue;
        uint64_t batch = 0;
        uint8_t *frame;
        size_t len;
        solo5_result_t r;
        while ((r = solo5_net_read_zc(h, &frame, &len)) == SOLO5_R_OK) {
            int echo = echo_reply(frame, len);
            if (echo || arp_reply(frame, len)) {
                if (solo5_net_queue(h, frame, len) == SOLO5_R_AGAIN) {
                    full++;
                    solo5_net_flush(h);
                    if (solo5_net_write(h, frame, len) != SOLO5_R_OK) {
                        say("FAILURE: the reply could not be sent\n");
                        return SOLO5_EXIT_FAILURE;
                    }
                }
                batch++;
                echoes += (uint64_t)echo;
            }
            solo5_net_read_done(h);
        }
        if (r != SOLO5_R_AGAIN) {
            say("FAILURE: solo5_net_read_zc failed\n");
            return SOLO5_EXIT_FAILURE;
        }
        if (batch) {
            solo5_net_flush(h);
            batches++;
            if (batch > largest)
                largest = batch;
        }
    }
    say("answered ");
    say_number(echoes);
    say(" echo requests in ");
    say_number(batches);
    say(" batches, largest ");
    say_number(largest);
    say(", ring full ");
    say_number(full);
    say("\nSUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
