/*
 * pyvmm guest runtime: what programs get beyond the Solo5 API.
 * Console formatting, string helpers, boot information, a bump allocator.
 */
#ifndef RT_H
#define RT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvt_abi.h"
#include "manifest.h"
#include "solo5.h"

/* Console: rt_puts writes the string as is (no newline added). */
void rt_puts(const char *s);
/* printf subset: %d %i %u %x %X %p %s %c %% with flags '-' and '0', a field
 * width (digits or '*') and the length modifiers l, ll, z. */
int rt_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int rt_vprintf(const char *fmt, va_list ap);
int rt_snprintf(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int rt_vsnprintf(char *buf, size_t size, const char *fmt, va_list ap);

/* Memory and strings (the compiler may also call the mem* ones itself). */
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
size_t strnlen(const char *s, size_t max);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);

/* Parse a decimal number at *s, advance *s past it.  False if there is no
 * digit or the value does not fit in 64 bits. */
bool rt_parse_u64(const char **s, uint64_t *value);
/* Skip spaces; return the start of the next word (may be the final NUL). */
const char *rt_skip_spaces(const char *s);

/* The boot information the tender passed at entry (read-only). */
const struct hvt_boot_info *rt_boot_info(void);
/* The host's filled-in manifest (mac, mtu, capacity, block_size, attached). */
const struct mft *rt_manifest(void);

/* The privilege level the guest runs at: 0 (kernel mode, as under stock
 * solo5-hvt) or 3 (user mode, which pyvmm may choose because the runtime's
 * capability note declares it; see caps_note.c).  Read from %cs, which is
 * unprivileged. */
int rt_cpl(void);

/* Memory from the heap, aligned to (align) (a power of two), never freed.
 * The top RT_STACK_RESERVE bytes of the heap are left to the stack.
 * Returns NULL when the heap is exhausted. */
#define RT_STACK_RESERVE (256 * 1024)
void *rt_alloc(size_t size, size_t align);

/*
 * Networking beyond Solo5 (net.c).  Each acquired net device has one of two
 * back ends, chosen when it is acquired: shmstream (pyvmm offered its
 * shared-memory rings for the device: frames are copied into and out of
 * ring slots without a VM exit) or the hvt hypercalls (one exit per frame:
 * stock solo5-hvt, pyvmm --shm=off, or a region that failed validation).
 * The Solo5 calls work the same on both; these add batching.
 */

/* 1 if device (h) uses the shmstream rings, 0 for the hypercall path (or an
 * unknown handle). */
int pyvmm_net_shm_active(solo5_handle_t h);

/* Put one frame (same limits as solo5_net_write) into the next TX slot and
 * make it visible to the host, without notifying it: call pyvmm_net_flush
 * after a batch.  SOLO5_R_AGAIN if the TX ring is full (flush, then retry,
 * or use solo5_net_write, which waits for space); SOLO5_R_EINVAL for a bad
 * handle or size (0 bytes, more than mtu + 14).  On the hypercall path this
 * is solo5_net_write. */
solo5_result_t pyvmm_net_queue(solo5_handle_t h, const uint8_t *buf,
        size_t size);

/* Notify the host of frames queued since the last flush, if it needs it:
 * one 4-byte outl to SHM_KICK_PIO, only when the host's IO thread announced
 * that it sleeps (event/hybrid modes); KVM absorbs it (ioeventfd), so no
 * exit to the tender.  A no-op on the hypercall path. */
void pyvmm_net_flush(solo5_handle_t h);

/* Flush, then wait (up to 1 s) until the host has taken every frame queued
 * on device (h): call it before exiting, since frames still in the TX ring
 * when the guest halts may never be sent.  SOLO5_R_OK once they are all
 * taken (at once on the hypercall path), SOLO5_R_AGAIN after the timeout,
 * SOLO5_R_EINVAL for a bad handle. */
solo5_result_t pyvmm_net_tx_wait(solo5_handle_t h);

/*
 * Zero-copy receive: the next waiting frame of device (h) where it lies,
 * without copying it out: SOLO5_R_OK with *frame and *len set,
 * SOLO5_R_AGAIN if none is waiting.  On the shmstream path *frame points
 * into the frame's RX slot, which stays the program's until
 * pyvmm_net_read_done(h) gives it back to the host; call that before the
 * next read on (h) (a read on (h) gives it back first by itself).  The
 * frame may be edited in place (an ARP reply, an echo) and queued before
 * it is given back.  The host can still change the slot's bytes: treat
 * them as the untrusted input any received frame is.  On the hypercall
 * path the frame is read (one exit) into a buffer of the runtime's.
 * solo5_net_read, which copies, is unchanged.
 */
solo5_result_t pyvmm_net_read_zc(solo5_handle_t h, uint8_t **frame,
        size_t *len);
void pyvmm_net_read_done(solo5_handle_t h);

/* What the back end of device (h) counted (all 0 on the hypercall path). */
struct pyvmm_net_stats {
    uint64_t rx_frames;        /* frames taken from the RX ring */
    uint64_t tx_frames;        /* frames put into the TX ring */
    uint64_t kicks;            /* flushes that notified the host */
    uint64_t kicks_suppressed; /* flushes with news that found it awake */
    uint64_t tx_ring_full;     /* times the TX ring was found full */
    uint64_t rx_dropped;       /* RX slots with a bad length, skipped */
    uint64_t bad_index;        /* impossible host index seen (host broken) */
};
void pyvmm_net_stats(solo5_handle_t h, struct pyvmm_net_stats *out);

#endif
