/*
 * ioctl(2) for Python: the result or -errno in one return value, so the
 * caller never reads errno across the cffi boundary.  Read by cffi.
 */
#ifndef PYVMM_KVM_IOCTL_H
#define PYVMM_KVM_IOCTL_H

/* ioctl with an argument pointer or value; returns the result or -errno. */
long pyvmm_ioctl_ptr(int fd, unsigned long request, void *arg);
long pyvmm_ioctl_val(int fd, unsigned long request, unsigned long arg);

#endif
