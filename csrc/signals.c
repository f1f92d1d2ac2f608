/* See signals.h: the stop signals' C handler. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/kvm.h>

#include "signals.h"

static volatile sig_atomic_t stop_signal;
static struct kvm_run *volatile stop_run;
static volatile int stop_fd = -1;
/* The vCPU thread (the one that installed the handlers): a process-directed
 * signal taken by another thread must still kick it out of KVM_RUN. */
static volatile pid_t stop_vcpu_tid;
static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define N_STOP_SIGNALS (sizeof(stop_signals) / sizeof(stop_signals[0]))
static struct sigaction saved_actions[N_STOP_SIGNALS];
static int signals_installed;

static void on_stop_signal(int sig)
{
    int saved_errno = errno;
    uint64_t one = 1;
    struct kvm_run *run = stop_run;

    if (!stop_signal)
        stop_signal = sig;
    if (run)
        run->immediate_exit = 1;
    if (stop_fd >= 0 && write(stop_fd, &one, sizeof(one)) < 0) {
        /* Nothing to do: the flag alone still stops the run loop. */
    }
    /*
     * Taken on another thread (pyvmm.api runs the vCPU off the main
     * thread): send the same signal to the vCPU thread, whose KVM_RUN (or
     * blocking call) it interrupts; this handler runs again there and finds
     * the flag set. tgkill is async-signal-safe; pthread_kill is not listed.
     */
    if (stop_vcpu_tid > 0 && syscall(SYS_gettid) != stop_vcpu_tid)
        syscall(SYS_tgkill, getpid(), stop_vcpu_tid, sig);
    errno = saved_errno;
}

int pyvmm_signals_install(int fd, void *kvm_run)
{
    struct sigaction sa;
    size_t i;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    stop_fd = fd;
    stop_run = kvm_run;
    stop_vcpu_tid = (pid_t)syscall(SYS_gettid);
    for (i = 0; i < N_STOP_SIGNALS; i++)
        if (sigaction(stop_signals[i], &sa, &saved_actions[i]) < 0)
            return -errno;
    signals_installed = 1;
    return 0;
}

void pyvmm_signals_restore(void)
{
    size_t i;

    if (!signals_installed)
        return;
    for (i = 0; i < N_STOP_SIGNALS; i++)
        sigaction(stop_signals[i], &saved_actions[i], NULL);
    signals_installed = 0;
    stop_run = NULL;
    stop_fd = -1;
    stop_vcpu_tid = 0;
}

int pyvmm_stop_signal(void)
{
    return stop_signal;
}

int pyvmm_stop_fd(void)
{
    return stop_fd;
}
