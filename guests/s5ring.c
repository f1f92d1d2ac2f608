/*
 * s5ring: an ICMP echo / ARP responder that does its network I/O through
 * Solo5's own ring I/O extension (v0.11+; csrc/solo5_ring.h, docs/abi.md)
 * instead of the net hypercalls, the way a ring-capable Solo5 unikernel
 * does: reads are submitted and the guest spins for their commit, writes
 * are submitted from a buffer of the guest's own and not waited for, and
 * the host is kicked (outl to port 0x600) only when it says it sleeps.
 *
 *     s5ring.hvt [IP [COUNT]]       (default 10.0.0.2, COUNT 0 = forever)
 *
 * Its capability note does not ask for shmstream, so pyvmm offers it the
 * Solo5 ring (unless --no-net-ring or --shm=off); without the ring it says
 * so and exits 1.
 */
#include "netproto.h"
#include "solo5_ring.h"
#include "shmstream_ring.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define USAGE "FAILURE: usage: s5ring.hvt [IP [COUNT]]\n"
/* A read that is not committed within this long means the host is gone. */
#define COMMIT_TIMEOUT_NS 2000000000ULL

static struct solo5_ring *ring;
static uint32_t ent_tail;       /* our copies of the indices we own */
static uint32_t com_head;
static uint32_t next_id;
static uint64_t kicks;
/* One buffer per submission slot: a write's frame stays put until the host
 * has taken the entry (ent_head moved past it). */
static uint8_t (*tx_buf)[2048];

static void kick_if_asked(void)
{
    shm_full_fence();
    if (__atomic_load_n(&ring->needs_kick, __ATOMIC_RELAXED)) {
        uint32_t id = 0;
        __asm__ __volatile__("outl %0, %1" : : "a"(id), "Nd"((uint16_t)HVT_RING_KICK_PIO)
                             : "memory");
        kicks++;
    }
}

static void cpu_relax(void)
{
    __asm__ __volatile__("pause" ::: "memory");
}

static void submit(uint32_t op, solo5_handle_t h, const void *data, uint32_t len,
                   uint32_t id)
{
    /* Wait for a free submission slot (the host consumes in order; the
     * kick that followed the submission filling the ring woke it). */
    while (ent_tail - shm_load_acquire(&ring->ent_head) >= SOLO5_RING_ENTRIES)
        cpu_relax();
    struct solo5_ring_entry *e = &ring->ent[ent_tail % SOLO5_RING_ENTRIES];
    e->operation = op;
    e->handle = (uint32_t)h;
    e->data = (uint64_t)(uintptr_t)data;
    e->len = len;
    e->id = id;
    e->reserved = 0;
    shm_store_release(&ring->ent_tail, ++ent_tail);
    kick_if_asked();
}

/* Read one frame through the ring: SOLO5_R_OK with *len, or AGAIN. */
static solo5_result_t ring_read(solo5_handle_t h, uint8_t *buf, size_t size,
                                size_t *len)
{
    uint32_t id = next_id++;
    uint64_t deadline = solo5_clock_monotonic() + COMMIT_TIMEOUT_NS;

    submit(SOLO5_RING_OP_READ, h, buf, (uint32_t)size, id);
    for (;;) {
        while (shm_load_acquire(&ring->com_tail) == com_head) {
            if (solo5_clock_monotonic() > deadline) {
                rt_puts("FAILURE: read not committed\n");
                solo5_exit(SOLO5_EXIT_FAILURE);
            }
            /* One kick per submission is enough: a host going to sleep
             * re-checks ent_tail after setting needs_kick. */
            cpu_relax();
        }
        struct solo5_ring_commit c = ring->com[com_head % SOLO5_RING_ENTRIES];
        shm_store_release(&ring->com_head, ++com_head);
        if (c.id != id)
            continue;   /* not ours (cannot happen with one reader) */
        if (c.ret == SOLO5_R_OK) {
            *len = c.len;
            return SOLO5_R_OK;
        }
        return (solo5_result_t)c.ret;
    }
}

static void ring_write(solo5_handle_t h, const uint8_t *frame, size_t len)
{
    uint8_t *copy = tx_buf[ent_tail % SOLO5_RING_ENTRIES];
    /* The slot's previous write was taken once ent_head passed it, which
     * submit() guarantees before reusing the entry. */
    while (ent_tail - shm_load_acquire(&ring->ent_head) >= SOLO5_RING_ENTRIES)
        cpu_relax();
    memcpy(copy, frame, len);
    submit(SOLO5_RING_OP_WRITE, h, copy, (uint32_t)len, next_id++);
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t count = 0;
    uint8_t ip[4] = { 10, 0, 0, 2 };

    if (!np_parse_ip_count(si->cmdline, ip, &count, USAGE))
        return SOLO5_EXIT_FAILURE;

    const struct hvt_boot_info *bi = rt_boot_info();
    if (!(bi->host_features & HVT_FEATURE_RING_IO) || bi->net_ring == 0) {
        rt_puts("FAILURE: the host offers no Solo5 ring\n");
        return SOLO5_EXIT_FAILURE;
    }
    ring = (struct solo5_ring *)(uintptr_t)bi->net_ring;
    ent_tail = ring->ent_tail;
    com_head = ring->com_head;

    struct np_iface ifc;
    if (!np_open(&ifc, "service0", ip))
        return SOLO5_EXIT_FAILURE;
    uint8_t *frame = ifc.frame;
    tx_buf = rt_alloc(sizeof(*tx_buf) * SOLO5_RING_ENTRIES, 64);
    if (tx_buf == NULL || ifc.frame_size > sizeof(*tx_buf)) {
        rt_puts("FAILURE: out of heap\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("ring: solo5\n");
    if (count != 0)
        rt_printf("answering %lu echo requests\n", (unsigned long)count);
    else
        rt_puts("answering echo requests forever\n");
    rt_puts("ready\n");

    uint64_t replies = 0, reads = 0;
    for (;;) {
        solo5_handle_set_t ready = 0;
        /* Blocks in the poll hypercall until the tap is readable. */
        solo5_yield(solo5_clock_monotonic() + 1000000000ULL, &ready);
        for (;;) {
            size_t len = 0, out;
            solo5_result_t r = ring_read(ifc.handle, frame, ifc.frame_size, &len);
            if (r == SOLO5_R_AGAIN)
                break;
            if (r != SOLO5_R_OK) {
                rt_printf("FAILURE: ring read: %d\n", (int)r);
                return SOLO5_EXIT_FAILURE;
            }
            reads++;
            struct np_ipv4 pkt;
            if ((out = np_arp_reply(&ifc, frame, len)) != 0) {
                ring_write(ifc.handle, frame, out);
            } else if (np_ipv4_parse(&ifc, frame, len, &pkt) &&
                       (out = np_icmp_echo_reply(&ifc, frame, &pkt)) != 0) {
                ring_write(ifc.handle, frame, out);
                replies++;
                if (count != 0 && replies == count) {
                    /* Let the host take the last write before halting. */
                    while (shm_load_acquire(&ring->ent_head) != ent_tail)
                        cpu_relax();
                    rt_printf("answered %lu echo requests\n", (unsigned long)replies);
                    rt_printf("ring reads: %lu, kicks: %lu\n", (unsigned long)reads,
                              (unsigned long)kicks);
                    rt_puts("SUCCESS\n");
                    return SOLO5_EXIT_SUCCESS;
                }
            }
        }
    }
}
