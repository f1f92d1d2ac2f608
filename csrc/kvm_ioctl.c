/* See kvm_ioctl.h: the KVM ioctls Python issues, errno folded in. */
#include <errno.h>
#include <sys/ioctl.h>

#include "kvm_ioctl.h"

long pyvmm_ioctl_ptr(int fd, unsigned long request, void *arg)
{
    long r = ioctl(fd, request, arg);
    return r < 0 ? -errno : r;
}

long pyvmm_ioctl_val(int fd, unsigned long request, unsigned long arg)
{
    long r = ioctl(fd, request, arg);
    return r < 0 ? -errno : r;
}
