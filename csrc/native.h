/*
 * The data plane's general helpers, one header per job; this umbrella is
 * for files that want several (hcfast.h, imagelease.c).  Each header is
 * read by cffi on its own (build_native.py's SHARED_HEADERS); this one
 * declares nothing itself.
 */
#ifndef PYVMM_NATIVE_H
#define PYVMM_NATIVE_H

#include "console.h"     /* the guest's console output */
#include "fdwait.h"      /* ppoll for readable fds; the poll-set limit */
#include "guestmap.h"    /* mmap / mprotect / munmap of guest memory */
#include "hctransport.h" /* which exit is an hvt hypercall */
#include "kvm_ioctl.h"   /* ioctl with errno folded in */
#include "kvm_run.h"     /* KVM_RUN and the decoded exit */
#include "netns.h"       /* setns, unshare */
#include "signals.h"     /* the stop signals' handler */

#endif
