/*
 * Test double of guests/runtime/hypercall.h for the host-native harness of
 * net_shm.c (testkit/guestnet_build.py puts this directory first on the
 * include path).  In a Linux process an outl to a hypercall port would
 * fault, and its argument (a 32-bit GPA) would not even be a whole pointer,
 * so hvt_hypercall calls the harness instead, which plays the tender.
 * A different include guard from the real header's: including both is a
 * redefinition error, never a silent mix.
 */
#ifndef TESTKIT_GUESTRT_HYPERCALL_H
#define TESTKIT_GUESTRT_HYPERCALL_H

#include <stdint.h>
#include "hvt_abi.h"

/* doubles.c: the tender's side of a hypercall. */
void gh_hypercall(enum hvt_hypercall n, volatile void *arg);

static inline void hvt_hypercall(enum hvt_hypercall n, volatile void *arg)
{
    gh_hypercall(n, arg);
}

#endif
