/* See devkind.h. */
#include <stdint.h>
#include <unistd.h>

#include "devkind.h"
#include "iothread.h"

static int devkind_service(void *p)
{
    struct devkind_ctx *c = p;
    uint64_t n;

    if (read(c->req_fd, &n, sizeof n) != sizeof n)
        return 0; /* nothing asked (non-blocking eventfd) */
    c->answer = c->request * 3 + 1;
    __atomic_add_fetch(&c->answered, 1, __ATOMIC_RELEASE);
    n = 1;
    if (write(c->done_fd, &n, sizeof n) != sizeof n)
        return 1; /* the asker gives up after its timeout */
    return 1;
}

static int devkind_prepare_sleep(void *p)
{
    (void)p;
    return 1; /* a request wakes the thread through req_fd (io_watch_fd) */
}

static const struct io_service_ops ops = {
    .name = "pyvmm-test",
    .service = devkind_service,
    .prepare_sleep = devkind_prepare_sleep,
};

const void *devkind_ops(void)
{
    return &ops;
}

uint64_t devkind_answered(struct devkind_ctx *ctx)
{
    return __atomic_load_n(&ctx->answered, __ATOMIC_ACQUIRE);
}
