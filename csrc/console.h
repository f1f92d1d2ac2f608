/*
 * The console: write all of buf to fd (stdout), in a way a stop signal can
 * always interrupt: the fd is non-blocking during the call and a full pipe
 * is waited for with poll on fd and the stop eventfd (signals.h).  Returns
 * len, or -EINTR when a stop signal arrived (the output is abandoned), or
 * -errno.  Read by cffi.
 */
#ifndef PYVMM_CONSOLE_H
#define PYVMM_CONSOLE_H

#include <stdint.h>

long pyvmm_console_write(int fd, const void *buf, uint64_t len);

#endif
