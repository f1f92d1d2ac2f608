/*
 * Tap frame I/O, the one copy: one frame per read or write of a
 * non-blocking tap (or any fd that moves one frame per call), with the one
 * drop policy and the one tally of what tap I/O counts.  Used by the
 * hypercall fast path (hcfast.c), the IO thread's services
 * (iothread_shm.c, iothread_solo5.c) and Python's TapBackend (through
 * cffi, which reads this header: plain types, integer #defines).
 *
 * The drop policy, as a NIC's:
 *   - a frame longer than the reader's buffer is dropped and counted,
 *     never handed over cut short (a one-byte overflow buffer after the
 *     caller's shows it: the kernel would truncate silently);
 *   - a reader that drops TAP_IO_TURN frames in a row answers AGAIN, so
 *     a flood of oversize frames cannot hold it (others get their turn);
 *   - a write the tap cannot take now (queue full, link down, a frame it
 *     refuses) or a frame shorter than the writer's minimum is dropped and
 *     counted, never an error: the guest's stack retransmits;
 *   - EINTR is retried; any other failure is the caller's to report.
 */
#ifndef PYVMM_TAP_IO_H
#define PYVMM_TAP_IO_H

#include <stdint.h>

/*
 * What a read or a write came to: FRAME, a frame moved (a read's is *len
 * bytes); AGAIN, a read found no frame waiting, or gave a turn; OVERSIZE,
 * tap_io_read_one dropped a frame too long; DROPPED, a write dropped the
 * frame; FAILED, the call failed otherwise (errno says why).
 */
#define TAP_IO_FRAME 0
#define TAP_IO_AGAIN 1
#define TAP_IO_OVERSIZE 2
#define TAP_IO_DROPPED 3
#define TAP_IO_FAILED 4

/* Oversize frames one tap_io_read drops before it answers AGAIN. */
#define TAP_IO_TURN 64

/*
 * Where a caller keeps its counts: pointers to its own counter fields, so
 * that every caller's counters keep their names; NULL: not counted.  A
 * read's tally and a write's are separate (a caller counts each its way);
 * a caller with nobody to report a failure to points errors where it
 * counts drops.
 */
struct tap_io_tally {
    uint64_t *frames;       /* frames read or written */
    uint64_t *bytes;        /* their bytes */
    uint64_t *again;        /* reads that found no frame (or gave a turn) */
    uint64_t *oversize;     /* frames dropped for being longer than the buffer */
    uint64_t *failed;       /* frames a write dropped */
    uint64_t *errors;       /* calls that failed otherwise (TAP_IO_FAILED) */
};

/* One frame at most into buf[0, size): TAP_IO_FRAME, _AGAIN, _OVERSIZE or
 * _FAILED.  A frame of 0 bytes (an empty datagram) is a frame. */
int tap_io_read_one(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t);
/* One frame, oversize ones dropped (at most TAP_IO_TURN, then AGAIN):
 * TAP_IO_FRAME, _AGAIN or _FAILED. */
int tap_io_read(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t);
/* One frame of len bytes: TAP_IO_FRAME, _DROPPED (also when len < min_len)
 * or _FAILED. */
int tap_io_write(int fd, const void *buf, uint32_t len, uint32_t min_len,
                 const struct tap_io_tally *t);
/* Count one frame of len bytes that a caller moved after its read (a read
 * into a staging buffer, delivered later). */
void tap_io_count_frame(const struct tap_io_tally *t, uint32_t len);

/*
 * Batched tap reads through io_uring (one ring for several taps): a chain
 * of reads per tap in flight, each straight into its caller's buffer, run
 * one after another by the kernel (hard-linked: a short read does not end
 * the chain), so their completions come back in the order the frames left
 * the tap.  The ring is restricted before it is enabled: READV on its
 * registered files only (the taps given to tap_uring_open), and no
 * registration afterwards but the synchronous cancel of its own reads; a
 * ring is no way around the sandbox's filter (docs/security.md).  Each
 * read has the same one-byte overflow iovec as tap_io_read_one, so a frame
 * too long for the buffer shows as a result of size + 1 (the caller drops
 * it).  A tap's reads end with its tap's queue; they may stay in flight
 * while nothing arrives.  Only one thread may queue, kick and reap.
 */
#define TAP_URING_MAX_TAPS 16
/* Reads in flight per tap at most (one chain). */
#define TAP_URING_CHAIN 32

struct tap_uring;

/* A ring for taps fds[0, n) (n <= TAP_URING_MAX_TAPS), enabled; 0 or
 * -errno (ENOSYS, EPERM: io_uring absent or refused; EINVAL: a kernel
 * without what the restrictions or the flags need). */
int tap_uring_open(const int *fds, uint32_t n, struct tap_uring **out);
/* Cancel what is in flight (tap_uring_cancel), unmap and close. */
void tap_uring_close(struct tap_uring *u);
int tap_uring_fd(const struct tap_uring *u);
/* Reads of tap `tap` in flight (queued or running, not yet reaped). */
uint32_t tap_uring_inflight(const struct tap_uring *u, uint32_t tap);
/* Queue a chain of n reads (n <= TAP_URING_CHAIN, none in flight on that
 * tap) of up to size bytes into bufs[i], each tagged tags[i]; 0, -EBUSY
 * (reads in flight) or -EINVAL. Submitted by the next tap_uring_kick. */
int tap_uring_read_chain(struct tap_uring *u, uint32_t tap, void *const *bufs,
                         const uint32_t *tags, uint32_t n, uint32_t size);
/* Submit what is queued and let the kernel run the reads that became
 * ready, if anything asks for it (one io_uring_enter, none otherwise);
 * never waits.  0 or -errno. */
int tap_uring_kick(struct tap_uring *u);
/* Completions waiting to be reaped, or reads the kernel would run on the
 * next kick: 1 (do not sleep), else 0. */
int tap_uring_ready(const struct tap_uring *u);
/* The next completion: 1 with its tap, tag and result (bytes read, a
 * frame too long showing as size + 1, or -errno), or 0 if none. */
int tap_uring_reap(struct tap_uring *u, uint32_t *tap, uint32_t *tag, int32_t *res);
/* Cancel every read in flight and wait until none is (their results are
 * discarded): after it, no read will write into a caller's buffer. */
void tap_uring_cancel(struct tap_uring *u);

#endif
