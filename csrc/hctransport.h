/*
 * The hvt hypercall transport, decoded once: the fast path (arch.h's
 * pyvmm_arch_hypercall, for hcfast.c) and Python's Arch.hypercall both ask
 * these functions, so C and Python agree on what is a hypercall by
 * construction.
 *
 *   x86_64   one 4-byte `outl` (not a `rep outsl`) of the argument's GPA
 *            to port HVT_HYPERCALL_PIO_BASE + n
 *   aarch64  one 32-bit store of the argument's GPA to
 *            HVT_HYPERCALL_MMIO_BASE + (n << 3)
 *
 * A hypercall's number n is 1..HVT_HYPERCALL_MAX, or a number past those
 * that a device kind of this run answers (pyvmm_hypercall_set_extra: the
 * test-only kind's HVT_HYPERCALL_PYVMM_TEST; none otherwise, so such a
 * write is a port access as solo5-hvt says); the GPA is the value written.
 * Both transports are compiled on every machine (they are only arithmetic
 * on an exit's fields), so each is checked on any host.  Read by cffi.
 */
#ifndef PYVMM_HCTRANSPORT_H
#define PYVMM_HCTRANSPORT_H

#include <stdint.h>

/*
 * The numbers past HVT_HYPERCALL_MAX (bit n, n < 64) that this run's
 * hypercall table answers, replacing the previous set; -1 (and nothing
 * changed) if a bit names one of Solo5's own.
 */
int pyvmm_hypercall_set_extra(uint64_t numbers);

/*
 * The hypercall slot a port write (size bytes, count elements, to port)
 * is aimed at: n when it has the transport's shape and port is
 * HVT_HYPERCALL_PIO_BASE + n with n 0 or a hypercall's number, -1 for
 * every other write.  Slot 0 is no hypercall: a guest error named by its
 * number.
 */
int32_t pyvmm_hypercall_pio_slot(uint32_t size, uint32_t count, uint32_t port);
/* The hypercall number a port write carries (its slot, not 0), 0 if none. */
uint32_t pyvmm_hypercall_pio(uint32_t size, uint32_t count, uint32_t port);

/* The same for an MMIO store of len bytes to addr (aarch64). */
int32_t pyvmm_hypercall_mmio_slot(uint32_t len, uint64_t addr);
/* The hypercall number an MMIO access carries, 0 if none (a load never). */
uint32_t pyvmm_hypercall_mmio(uint32_t is_write, uint32_t len, uint64_t addr);

/*
 * The doorbell a write rings, named by its x86 port on every machine
 * (HVT_RING_KICK_PIO, SHM_KICK_PIO, PYVMM_NULL_KICK_PIO), or 0: one 4-byte
 * `outl` to that port, or one 32-bit store to its MMIO address (aarch64).
 * A doorbell KVM absorbs (an ioeventfd) never exits; one that does is
 * answered by whoever serves it (hcfast.c, Python's exit loop).
 */
uint32_t pyvmm_doorbell_pio(uint32_t size, uint32_t count, uint32_t port);
uint32_t pyvmm_doorbell_mmio(uint32_t is_write, uint32_t len, uint64_t addr);

#endif
