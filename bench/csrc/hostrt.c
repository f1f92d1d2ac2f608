/*
 * The guest runtime's network API on a plain Linux process: the baseline
 * bench/pps.py compares every pyvmm mode with.
 *
 *   cc -O2 -Iguests/runtime -Icsrc bench/csrc/hostrt.c guests/udpsink.c \
 *      guests/runtime/netproto.c -o udpsink-process
 *   udpsink-process TAP MAC [GUEST ARGS...]
 *
 * The guest programs (udpsink, udpsend, udpecho) and their protocol code
 * (netproto.c) are compiled unchanged against this file instead of the
 * guest runtime, so the process receives, parses, checksums and checks each
 * frame with exactly the code the guest runs; only the device underneath
 * differs: one thread reading and writing the tap (opened by name, IFF_TAP
 * without packet information, as pyvmm opens it) with one read(2) or
 * write(2) per frame and poll(2) for solo5_yield.  No VM, no rings, no
 * second thread: the floor a tender's data path is measured against.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <net/ethernet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"

#define HANDLE 1

static int tap_fd = -1;
static uint8_t tap_mac[6];
static size_t tap_mtu = 1500;

static int open_tap(const char *name)
{
    struct ifreq ifr;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    int sock;

    if (fd < 0)
        return -1;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        close(fd);
        return -1;
    }
    sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock >= 0 && ioctl(sock, SIOCGIFMTU, &ifr) == 0)
        tap_mtu = (size_t)ifr.ifr_mtu;
    if (sock >= 0)
        close(sock);
    return fd;
}

static int parse_mac(const char *s, uint8_t mac[6])
{
    unsigned int b[6];
    int i;

    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6)
        return -1;
    for (i = 0; i < 6; i++)
        mac[i] = (uint8_t)b[i];
    return 0;
}

/* ---- the Solo5 calls the network programs use ------------------------- */

solo5_time_t solo5_clock_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void solo5_exit(int status)
{
    fflush(stdout);
    exit(status & 0xff);
}

solo5_result_t solo5_net_acquire(const char *name, solo5_handle_t *handle,
        struct solo5_net_info *info)
{
    if (strcmp(name, "service0") != 0)
        return SOLO5_R_EINVAL;
    *handle = HANDLE;
    memcpy(info->mac_address, tap_mac, sizeof(tap_mac));
    info->mtu = tap_mtu;
    return SOLO5_R_OK;
}

solo5_result_t solo5_net_read(solo5_handle_t h, uint8_t *buf, size_t size,
        size_t *read_size)
{
    ssize_t n;

    if (h != HANDLE)
        return SOLO5_R_EINVAL;
    do
        n = read(tap_fd, buf, size);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN ? SOLO5_R_AGAIN : SOLO5_R_EUNSPEC;
    *read_size = (size_t)n;
    return SOLO5_R_OK;
}

solo5_result_t solo5_net_write(solo5_handle_t h, const uint8_t *buf,
        size_t size)
{
    ssize_t n;

    if (h != HANDLE || size == 0 || size > tap_mtu + SOLO5_NET_HLEN)
        return SOLO5_R_EINVAL;
    do
        n = write(tap_fd, buf, size);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)size ? SOLO5_R_OK : SOLO5_R_EUNSPEC;
}

void solo5_yield(solo5_time_t deadline, solo5_handle_set_t *ready_set)
{
    solo5_time_t now = solo5_clock_monotonic();
    uint64_t left = deadline > now ? deadline - now : 0;
    struct timespec ts = { (time_t)(left / 1000000000u), (long)(left % 1000000000u) };
    struct pollfd p = { .fd = tap_fd, .events = POLLIN };
    int r = ppoll(&p, 1, &ts, NULL);

    if (ready_set != NULL)
        *ready_set = r > 0 && (p.revents & POLLIN) ? 1ULL << HANDLE : 0;
}

/* ---- the runtime's additions (rt.h) ------------------------------------ */

int pyvmm_net_shm_active(solo5_handle_t h)
{
    (void)h;
    return 0;
}

/* A process has no slots to lend: the frame is read into a buffer, as the
 * runtime does on the hypercall path. */
solo5_result_t pyvmm_net_read_zc(solo5_handle_t h, uint8_t **frame, size_t *len)
{
    static uint8_t buf[65536];
    solo5_result_t r = solo5_net_read(h, buf, sizeof(buf), len);

    if (r == SOLO5_R_OK)
        *frame = buf;
    return r;
}

void pyvmm_net_read_done(solo5_handle_t h)
{
    (void)h;
}

solo5_result_t pyvmm_net_queue(solo5_handle_t h, const uint8_t *buf, size_t size)
{
    return solo5_net_write(h, buf, size);
}

void pyvmm_net_flush(solo5_handle_t h)
{
    (void)h;
}

solo5_result_t pyvmm_net_tx_wait(solo5_handle_t h)
{
    return h == HANDLE ? SOLO5_R_OK : SOLO5_R_EINVAL;
}

void pyvmm_net_stats(solo5_handle_t h, struct pyvmm_net_stats *out)
{
    (void)h;
    memset(out, 0, sizeof(*out));
}

int rt_vprintf(const char *fmt, va_list ap)
{
    int n = vprintf(fmt, ap);
    fflush(stdout);
    return n;
}

int rt_printf(const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = rt_vprintf(fmt, ap);
    va_end(ap);
    return n;
}

void rt_puts(const char *s)
{
    fputs(s, stdout);
    fflush(stdout);
}

void *rt_alloc(size_t size, size_t align)
{
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) ? NULL : p;
}

int main(int argc, char **argv)
{
    struct solo5_start_info si = { 0 };
    size_t len = 1;
    char *cmdline;
    int i;

    if (argc < 3 || parse_mac(argv[2], tap_mac) < 0) {
        fprintf(stderr, "usage: %s TAP MAC [ARGS...]\n", argv[0]);
        return 2;
    }
    if ((tap_fd = open_tap(argv[1])) < 0) {
        fprintf(stderr, "%s: tap %s: %s\n", argv[0], argv[1], strerror(errno));
        return 1;
    }
    for (i = 3; i < argc; i++)
        len += strlen(argv[i]) + 1;
    cmdline = calloc(1, len);
    for (i = 3; cmdline && i < argc; i++) {
        strcat(cmdline, argv[i]);
        if (i + 1 < argc)
            strcat(cmdline, " ");
    }
    si.cmdline = cmdline ? cmdline : "";
    solo5_exit(solo5_app_main(&si));
}
