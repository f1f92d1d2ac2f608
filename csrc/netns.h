/* Namespace calls for pyvmm/host/netns.py: 0 or -errno.  Read by cffi. */
#ifndef PYVMM_NETNS_H
#define PYVMM_NETNS_H

/* setns(2) for the calling thread. */
int pyvmm_setns(int fd, int nstype);

/* unshare(2) for the calling process. */
int pyvmm_unshare(int flags);

#endif
