/*
 * The Solo5 public API as implemented by the pyvmm guest runtime.
 *
 * Names, types and result codes follow Solo5's public interface, so a
 * program written against Solo5 builds against this runtime unchanged.
 * Everything here runs on the hvt ABI (see csrc/hvt_abi.h).
 */
#ifndef SOLO5_H_INCLUDED
#define SOLO5_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    SOLO5_R_OK = 0,     /* done */
    SOLO5_R_AGAIN,      /* nothing to do now (no frame waiting); retry */
    SOLO5_R_EINVAL,     /* bad argument: handle, offset, size, name */
    SOLO5_R_EUNSPEC     /* anything else */
} solo5_result_t;

/* What the program gets at entry.  The heap is one read/write region that
 * also holds the initial stack, which grows down from its end. */
struct solo5_start_info {
    const char *cmdline;
    uintptr_t heap_start;
    size_t heap_size;
};

/* The program's entry point; returning from it is solo5_exit(return value). */
int solo5_app_main(const struct solo5_start_info *info);

#define SOLO5_EXIT_SUCCESS 0
#define SOLO5_EXIT_FAILURE 1
#define SOLO5_EXIT_ABORT 255

/* End the guest; the tender exits with (status).  255 and up are Solo5's. */
void solo5_exit(int status) __attribute__((noreturn));
/* End the guest abnormally: exit status SOLO5_EXIT_ABORT. */
void solo5_abort(void) __attribute__((noreturn));

/* Thread-local storage base (x86_64: FS.base).  SOLO5_R_EINVAL for a
 * non-canonical address; SOLO5_R_EUNSPEC in user mode (CPL 3) on a CPU
 * without FSGSBASE. */
solo5_result_t solo5_set_tls_base(uintptr_t base);

/* Thread-local storage blocks (Solo5's API): the bytes one block takes,
 * the thread pointer to give solo5_set_tls_base for a block at (tls), and
 * filling a block with the program's initial TLS values.  Provided when
 * the runtime is linked as Solo5 bindings (solo5_pyvmm.o), whose linker
 * script lays the TLS template out; pyvmm's own guests use no TLS. */
size_t solo5_tls_size(void);
uintptr_t solo5_tls_tp_offset(uintptr_t tls);
solo5_result_t solo5_tls_init(uintptr_t tls);

/* Time in nanoseconds. */
typedef uint64_t solo5_time_t;
/* Nanoseconds since an unspecified moment (here: guest start), from the TSC. */
solo5_time_t solo5_clock_monotonic(void);
/* Nanoseconds since 1970-01-01 UTC, from the host's clock. */
solo5_time_t solo5_clock_wall(void);

typedef uint64_t solo5_handle_t;
/* A set of up to 64 handles: bit i is handle i. */
typedef uint64_t solo5_handle_set_t;

/* Block until monotonic time reaches (deadline) or a network device has
 * input.  If (ready_set) is not NULL it receives the handles with input. */
void solo5_yield(solo5_time_t deadline, solo5_handle_set_t *ready_set);

/* Write (size) bytes to the console (best effort). */
void solo5_console_write(const char *buf, size_t size);

/* Network. */
#define SOLO5_NET_ALEN 6    /* MAC address length */
#define SOLO5_NET_HLEN 14   /* Ethernet header length */

struct solo5_net_info {
    uint8_t mac_address[SOLO5_NET_ALEN];
    size_t mtu;             /* payload bytes, without the Ethernet header */
};

/* Look up the net device (name) from the manifest; once per device. */
solo5_result_t solo5_net_acquire(const char *name, solo5_handle_t *handle,
        struct solo5_net_info *info);
/* Send one frame (Ethernet header included), at most mtu + HLEN bytes. */
solo5_result_t solo5_net_write(solo5_handle_t handle, const uint8_t *buf,
        size_t size);
/* Receive one frame without blocking into a buffer of at least mtu + HLEN
 * bytes.  SOLO5_R_AGAIN when nothing is waiting; on SOLO5_R_OK the frame's
 * length is in (*read_size). */
solo5_result_t solo5_net_read(solo5_handle_t handle, uint8_t *buf,
        size_t size, size_t *read_size);

/* Block storage. */
typedef uint64_t solo5_off_t;

struct solo5_block_info {
    solo5_off_t capacity;   /* bytes */
    solo5_off_t block_size; /* bytes: the unit of every transfer */
};

/* Look up the block device (name) from the manifest; once per device. */
solo5_result_t solo5_block_acquire(const char *name, solo5_handle_t *handle,
        struct solo5_block_info *info);
/* Whole blocks only: (offset) and (size) multiples of block_size and the
 * range inside capacity, else SOLO5_R_EINVAL.  No short transfers. */
solo5_result_t solo5_block_write(solo5_handle_t handle, solo5_off_t offset,
        const uint8_t *buf, size_t size);
solo5_result_t solo5_block_read(solo5_handle_t handle, solo5_off_t offset,
        uint8_t *buf, size_t size);

#endif
