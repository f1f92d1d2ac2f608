/*
 * The test-only device kind's IO service (testkit/devkind): what the IO
 * thread runs for it through pyvmm's ops table (csrc/iothread.h,
 * io_add_service).  One request at a time: the vCPU thread stores
 * `request` and signals req_fd; the IO thread's pass answers it
 * (answer = request * 3 + 1), counts it and signals done_fd.  Not part of
 * pyvmm: only tests register the kind.
 */
#ifndef PYVMM_TESTKIT_DEVKIND_H
#define PYVMM_TESTKIT_DEVKIND_H

#include <stdint.h>

struct devkind_ctx {
    int req_fd;         /* eventfd: a request is waiting (the IO thread watches it) */
    int done_fd;        /* eventfd: the request is answered */
    uint64_t request;
    uint64_t answer;
    uint64_t answered;  /* requests answered (read with devkind_answered) */
};

/* The ops table (a `const struct io_service_ops *` for io_add_service). */
const void *devkind_ops(void);
/* Requests answered so far, safe to read while the IO thread runs. */
uint64_t devkind_answered(struct devkind_ctx *ctx);

#endif
