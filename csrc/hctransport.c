/* See hctransport.h: which port write or MMIO store is an hvt hypercall. */
#include "hctransport.h"
#include "hvt_abi.h"
#include "pyvmm_abi.h"
#include "shmstream.h"

/* Numbers past Solo5's that a device kind of this run answers (bit n),
 * set before the vCPU runs: none for every guest but a test kind's. */
static uint64_t extra_slots;

int pyvmm_hypercall_set_extra(uint64_t numbers)
{
    uint64_t solo5 = (2ULL << HVT_HYPERCALL_MAX) - 1;   /* bits 0..MAX */
    if (numbers & solo5)
        return -1;
    extra_slots = numbers;
    return 0;
}

/* The slots: 0, Solo5's hypercalls and those a kind of this run answers. */
static int is_slot(uint64_t n)
{
    return n <= HVT_HYPERCALL_MAX || (n < 64 && (extra_slots >> n) & 1);
}

int32_t pyvmm_hypercall_pio_slot(uint32_t size, uint32_t count, uint32_t port)
{
    /* `rep outsl` exits with count > 1: a string of values, no hypercall. */
    if (size != 4 || count != 1 || port < HVT_HYPERCALL_PIO_BASE ||
        !is_slot(port - HVT_HYPERCALL_PIO_BASE))
        return -1;
    return (int32_t)(port - HVT_HYPERCALL_PIO_BASE);
}

uint32_t pyvmm_hypercall_pio(uint32_t size, uint32_t count, uint32_t port)
{
    int32_t slot = pyvmm_hypercall_pio_slot(size, count, port);
    return slot > 0 ? (uint32_t)slot : 0;
}

int32_t pyvmm_hypercall_mmio_slot(uint32_t len, uint64_t addr)
{
    uint64_t off;

    /* `str w`: 4 bytes; each hypercall has its own 8-byte-aligned address. */
    if (len != 4 || addr < HVT_HYPERCALL_MMIO_BASE)
        return -1;
    off = addr - HVT_HYPERCALL_MMIO_BASE;
    if (off & 7 || !is_slot(off >> 3))
        return -1;
    return (int32_t)(off >> 3);
}

uint32_t pyvmm_hypercall_mmio(uint32_t is_write, uint32_t len, uint64_t addr)
{
    int32_t slot = is_write ? pyvmm_hypercall_mmio_slot(len, addr) : -1;
    return slot > 0 ? (uint32_t)slot : 0;
}

/* The doorbells, by their port. */
static int is_doorbell(uint32_t port)
{
    return port == HVT_RING_KICK_PIO || port == SHM_KICK_PIO || port == PYVMM_NULL_KICK_PIO;
}

uint32_t pyvmm_doorbell_pio(uint32_t size, uint32_t count, uint32_t port)
{
    return size == 4 && count == 1 && is_doorbell(port) ? port : 0;
}

/* The same doorbells at their MMIO addresses (aarch64), named by port. */
uint32_t pyvmm_doorbell_mmio(uint32_t is_write, uint32_t len, uint64_t addr)
{
    if (!is_write || len != 4)
        return 0;
    switch (addr) {
    case HVT_RING_KICK_MMIO:
        return HVT_RING_KICK_PIO;
    case SHM_KICK_MMIO:
        return SHM_KICK_PIO;
    case PYVMM_NULL_KICK_MMIO:
        return PYVMM_NULL_KICK_PIO;
    default:
        return 0;
    }
}
