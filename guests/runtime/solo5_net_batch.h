/*
 * Batched transmit and zero-copy receive for Solo5 programs: optional
 * additions to Solo5's network API, provided by pyvmm's guest runtime
 * (linked as solo5_pyvmm.o, -z solo5-abi=pyvmm, or into pyvmm's own
 * guests).  solo5_net_write and solo5_net_read stay correct and fast
 * without them; these save the per-frame notification and the copy.
 *
 * Each call takes a handle from solo5_net_acquire and behaves the same on
 * both back ends the runtime chooses between per device: pyvmm's
 * shared-memory rings (shmstream) and the hvt hypercalls (a stock
 * solo5-hvt, pyvmm --shm=off).  Stock Solo5 bindings do not have them.
 */
#ifndef SOLO5_NET_BATCH_H
#define SOLO5_NET_BATCH_H

#include "solo5.h"

/*
 * Put one frame (Ethernet header included, at most mtu + SOLO5_NET_HLEN
 * bytes) into the device's transmit ring and make it visible to the host,
 * without notifying it: call solo5_net_flush after a batch.  The buffer
 * may be reused at once.  SOLO5_R_AGAIN: the ring is full (flush, then
 * retry, or call solo5_net_write, which waits for room).  SOLO5_R_EINVAL:
 * a bad handle, 0 bytes or too many.  On the hypercall back end the frame
 * is sent at once, as by solo5_net_write.
 */
solo5_result_t solo5_net_queue(solo5_handle_t handle, const uint8_t *buf,
        size_t size);

/*
 * Notify the host of the frames queued since the last flush, if it needs
 * it: only when its I/O thread said it sleeps, and then with a doorbell
 * the kernel absorbs (no exit to the tender).  Nothing to do otherwise, and
 * on the hypercall back end.
 */
void solo5_net_flush(solo5_handle_t handle);

/*
 * Zero-copy receive: the next waiting frame where it lies.  SOLO5_R_OK
 * with *frame and *size set, SOLO5_R_AGAIN if none is waiting,
 * SOLO5_R_EINVAL for a bad handle.  The frame stays valid (and may be
 * edited in place, e.g. turned into a reply and queued) until
 * solo5_net_read_done(handle) or the next read on the handle, which gives
 * its slot back to the host.  The host can still change its bytes: treat
 * them as the untrusted input every received frame is.  On the hypercall
 * back end the frame is read into a buffer of the runtime's.
 */
solo5_result_t solo5_net_read_zc(solo5_handle_t handle, uint8_t **frame,
        size_t *size);
void solo5_net_read_done(solo5_handle_t handle);

#endif
