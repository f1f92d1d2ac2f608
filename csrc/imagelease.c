/* See imagelease.h: image files mapped under a read lease, copied into
 * anonymous memory when a writer comes, before the writer may go on. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "guestmem.h"
#include "imagelease.h"
#include "native.h"

_Static_assert(PYVMM_LEASE_BROKEN == ESTALE, "the broken-lease answer is ESTALE");

/* The notice's signal; SIGIO comes instead when the queue is full. */
#define LEASE_SIGNAL (SIGRTMIN + 4)

struct lease {
    int used;
    int fd;       /* the lease's own descriptor; -1 once released */
    pid_t pid;    /* a forked child's copy of the table is not its own */
    int state;    /* PYVMM_LEASE_* */
};

struct range {
    uint64_t addr, len;
    int slot;     /* -1: a free entry */
};

static struct lease leases[PYVMM_LEASE_MAX];
static struct range ranges[PYVMM_LEASE_RANGES];
static struct pyvmm_lease_counters counters;
static int installed;

/*
 * One lock for the table, taken by the handler and by every call from
 * Python. A calling thread blocks the notice first, so the handler never
 * waits on a lock its own thread holds; on another thread it waits for a
 * table update (a mapping, a few microseconds) to end.
 */
static int busy;
static sigset_t enter_mask, fork_mask;

static void lock(void)
{
    while (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void unlock(void)
{
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
}

static void enter(sigset_t *old)
{
    pthread_sigmask(SIG_BLOCK, &enter_mask, old);
    lock();
}

static void leave(const sigset_t *old)
{
    unlock();
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* The range's bytes into a new anonymous mapping, moved over it in one
 * step: every byte reads the same before and after, none is the file's. */
static int copy_out(uint64_t addr, uint64_t len)
{
    void *old = (void *)(uintptr_t)addr;
    void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (tmp == MAP_FAILED)
        return -errno;
    if (pyvmm_copy_guarded(tmp, old, len) < 0 || mprotect(tmp, len, PROT_READ) < 0 ||
        mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, old) == MAP_FAILED) {
        munmap(tmp, len);
        return -EFAULT;
    }
    return 0;
}

/* A writer came for lease ``slot``: copy its ranges, then let it through. */
static void give_way(int slot)
{
    struct lease *l = &leases[slot];
    int lost = 0, i;

    counters.breaks++;
    for (i = 0; i < PYVMM_LEASE_RANGES; i++) {
        struct range *r = &ranges[i];
        if (r->slot != slot)
            continue;
        if (copy_out(r->addr, r->len) == 0) {
            counters.ranges_copied++;
            counters.bytes_copied += r->len;
        } else {
            counters.ranges_lost++;
            lost = 1;
        }
        r->slot = -1;
    }
    l->state = lost ? PYVMM_LEASE_LOST : PYVMM_LEASE_COPIED;
    close(l->fd);   /* nothing else refers to it: the lease ends here */
    l->fd = -1;
}

static void on_notice(int sig, siginfo_t *si, void *context)
{
    int saved_errno = errno;
    pid_t me = getpid();
    /* The kernel's notice names the lease's descriptor; SIGIO (the queue
     * was full) or a signal someone sent does not: every lease then. */
    int named = sig != SIGIO && si->si_code > 0;
    int i;

    (void)context;
    lock();
    for (i = 0; i < PYVMM_LEASE_MAX; i++) {
        struct lease *l = &leases[i];
        if (l->used && l->fd >= 0 && l->pid == me && (!named || si->si_fd == l->fd))
            give_way(i);
    }
    unlock();
    errno = saved_errno;
}

/* A forked child shares the parent's lease descriptors: closing its copies
 * lets the parent's release end the leases. Its copies of the mappings
 * are no longer watched (a child that runs a guest takes leases of its own). */
static void fork_prepare(void)
{
    enter(&fork_mask);
}

static void fork_parent(void)
{
    leave(&fork_mask);
}

static void fork_child(void)
{
    int i;

    for (i = 0; i < PYVMM_LEASE_MAX; i++) {
        if (leases[i].used && leases[i].fd >= 0)
            close(leases[i].fd);
        leases[i].used = 0;
        leases[i].fd = -1;
    }
    for (i = 0; i < PYVMM_LEASE_RANGES; i++)
        ranges[i].slot = -1;
    leave(&fork_mask);
}

/* Called with the lock held (the first take). */
static int install(void)
{
    struct sigaction sa;
    int i;

    if (installed)
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_notice;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sa.sa_mask = enter_mask;
    if (sigaction(LEASE_SIGNAL, &sa, NULL) < 0 || sigaction(SIGIO, &sa, NULL) < 0)
        return -errno;
    for (i = 0; i < PYVMM_LEASE_RANGES; i++)
        ranges[i].slot = -1;
    if (pthread_atfork(fork_prepare, fork_parent, fork_child))
        return -ENOMEM;
    installed = 1;
    return 0;
}

static void init_mask(void)
{
    sigemptyset(&enter_mask);
    sigaddset(&enter_mask, LEASE_SIGNAL);
    sigaddset(&enter_mask, SIGIO);
}

int pyvmm_lease_take(int fd)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    sigset_t old;
    int slot = -1, err, i;

    pthread_once(&once, init_mask);
    enter(&old);
    err = install();
    for (i = 0; !err && i < PYVMM_LEASE_MAX; i++)
        if (!leases[i].used) {
            slot = i;
            break;
        }
    if (!err && slot < 0)
        err = -ENOSPC;
    if (!err && (fcntl(fd, F_SETSIG, LEASE_SIGNAL) < 0 || fcntl(fd, F_SETLEASE, F_RDLCK) < 0))
        err = -errno;
    if (!err) {
        leases[slot].used = 1;
        leases[slot].fd = fd;
        leases[slot].pid = getpid();
        leases[slot].state = PYVMM_LEASE_HELD;
    }
    leave(&old);
    return err ? err : slot;
}

static int held(int slot)
{
    return slot >= 0 && slot < PYVMM_LEASE_MAX && leases[slot].used &&
           leases[slot].state == PYVMM_LEASE_HELD && leases[slot].pid == getpid();
}

static struct range *free_range(void)
{
    int i;

    for (i = 0; i < PYVMM_LEASE_RANGES; i++)
        if (ranges[i].slot < 0)
            return &ranges[i];
    return NULL;
}

/*
 * The one way a leased mapping is made: the lease still held and a range
 * free to watch it, both checked under the lock the notice takes, so a
 * writer never finds a mapping the table does not know. ``fixed``: over
 * guest memory at ``*addr`` (pyvmm_map_file's answers); else read-only
 * anywhere, the address put in ``*addr``.
 */
static int map_leased(int slot, uint64_t *addr, uint64_t len, int fd, uint64_t offset, int fixed)
{
    struct range *r = NULL;
    sigset_t old;
    int result;

    if (!installed)
        return -PYVMM_LEASE_BROKEN;
    enter(&old);
    if (!held(slot)) {
        result = -PYVMM_LEASE_BROKEN;
    } else if (!(r = free_range())) {
        result = -ENOSPC;
    } else if (fixed) {
        result = pyvmm_map_file(*addr, len, fd, offset);
    } else {
        void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        result = p == MAP_FAILED ? -errno : 0;
        *addr = (uint64_t)(uintptr_t)p;
    }
    if (result == 0)
        *r = (struct range){ *addr, len, slot };
    leave(&old);
    return result;
}

int64_t pyvmm_lease_map_view(int slot, uint64_t len, int fd)
{
    uint64_t addr = 0;
    int err = map_leased(slot, &addr, len, fd, 0, 0);

    return err ? err : (int64_t)addr;
}

int pyvmm_lease_map_fixed(int slot, uint64_t addr, uint64_t len, int fd, uint64_t offset)
{
    return map_leased(slot, &addr, len, fd, offset, 1);
}

void pyvmm_lease_forget(uint64_t addr, uint64_t len)
{
    sigset_t old;
    int i;

    if (!installed)
        return;
    enter(&old);
    for (i = 0; i < PYVMM_LEASE_RANGES; i++) {
        struct range *r = &ranges[i];
        if (r->slot >= 0 && r->addr >= addr && r->addr - addr < len)
            r->slot = -1;
    }
    leave(&old);
}

void pyvmm_lease_release(int slot)
{
    sigset_t old;
    int i;

    if (!installed || slot < 0 || slot >= PYVMM_LEASE_MAX)
        return;
    enter(&old);
    if (leases[slot].used && leases[slot].pid == getpid()) {
        if (leases[slot].fd >= 0)
            close(leases[slot].fd);
        leases[slot].used = 0;
        leases[slot].fd = -1;
        for (i = 0; i < PYVMM_LEASE_RANGES; i++)
            if (ranges[i].slot == slot)
                ranges[i].slot = -1;
    }
    leave(&old);
}

int pyvmm_lease_state(int slot)
{
    if (slot < 0 || slot >= PYVMM_LEASE_MAX || !leases[slot].used ||
        leases[slot].pid != getpid())
        return PYVMM_LEASE_CLOSED;
    return __atomic_load_n(&leases[slot].state, __ATOMIC_ACQUIRE);
}

const struct pyvmm_lease_counters *pyvmm_lease_counters(void)
{
    return &counters;
}

uint64_t pyvmm_fs_magic(int fd)
{
    struct statfs sf;

    if (fstatfs(fd, &sf) < 0)
        return 0;
    return (uint64_t)(unsigned long)sf.f_type & 0xffffffffu;
}
