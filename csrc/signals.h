/*
 * Stop signals (SIGINT, SIGTERM, SIGHUP) are caught in C, not by Python:
 * the handler records the signal, sets immediate_exit in the registered
 * kvm_run (so a KVM_RUN entered just after the signal returns at once
 * instead of running the guest until its next exit) and signals stop_fd,
 * an eventfd the poll hypercall waits on.  No race window, no Python
 * exception raised at an arbitrary point.  Read by cffi.
 */
#ifndef PYVMM_SIGNALS_H
#define PYVMM_SIGNALS_H

int pyvmm_signals_install(int stop_fd, void *kvm_run);
void pyvmm_signals_restore(void);
/* The stop signal taken since the install, or 0. */
int pyvmm_stop_signal(void);
/* The installed stop eventfd, or -1 (for waits a stop must end: console.c). */
int pyvmm_stop_fd(void);

#endif
