/*
 * Runtime internals shared between runtime files; programs do not include it.
 */
#ifndef RT_INTERNAL_H
#define RT_INTERNAL_H

#include "rt.h"

/* init.c */
void rt_init(const struct hvt_boot_info *bi) __attribute__((noreturn));
/* The manifest entry (handle) if it exists and has (type), else NULL. */
const struct mft_entry *rt_mft_entry(solo5_handle_t handle, uint32_t type);
/* Acquire the attached device (name) of (type) once: its handle, or
 * SOLO5_R_EINVAL if it is missing, unattached or already acquired. */
solo5_result_t rt_mft_acquire(const char *name, uint32_t type,
        solo5_handle_t *handle, const struct mft_entry **entry);

/* platform.c: every privileged CPU setup goes here and only here, so it can
 * be skipped when the runtime runs at CPL 3. */
void rt_platform_setup(const struct hvt_boot_info *bi);

/* clock.c */
void rt_clock_init(const struct hvt_boot_info *bi);

/* heap.c */
void rt_heap_init(uintptr_t start, uintptr_t end);

/* exit.c: halt hypercall with an optional abort cookie. */
void rt_halt(int status, void *cookie) __attribute__((noreturn));

/*
 * Device drivers.  The Solo5 net and block calls check the handle and the
 * arguments, then go through one of these, so a driver that does not use a
 * hypercall per frame (a shared-memory ring) can replace the hypercall one
 * for a device without touching the API code.  A driver's calls receive
 * checked arguments: a valid, acquired handle of the right type.
 */
struct rt_net_driver {
    const char *name;
    solo5_result_t (*write)(solo5_handle_t h, const uint8_t *buf, size_t size);
    solo5_result_t (*read)(solo5_handle_t h, uint8_t *buf, size_t size,
            size_t *read_size);
};

struct rt_block_driver {
    const char *name;
    solo5_result_t (*write)(solo5_handle_t h, solo5_off_t offset,
            const uint8_t *buf, size_t size);
    solo5_result_t (*read)(solo5_handle_t h, solo5_off_t offset,
            uint8_t *buf, size_t size);
};

extern const struct rt_net_driver rt_net_hvt_driver;     /* net_hvt.c */
extern const struct rt_block_driver rt_block_hvt_driver; /* block_hvt.c */

/* Choose the driver for one net device (default: rt_net_hvt_driver). */
void rt_net_set_driver(solo5_handle_t h, const struct rt_net_driver *drv);

#endif
