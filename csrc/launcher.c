/*
 * The pyvmm command: a native launcher in front of the interpreter.
 *
 * Two jobs (docs/startup.md):
 *
 * 1. No stop-signal window while the interpreter starts. SIGINT, SIGTERM,
 *    SIGHUP (and SIGUSR1, the counters) are blocked here, before anything
 *    else; a blocked signal stays blocked, and pending, across execve. The
 *    interpreter's start-up therefore cannot be interrupted; pyvmm.entry
 *    installs its handlers and only then unblocks them, so a signal sent
 *    at any moment since this program started ends pyvmm with 128 + N
 *    and its one line.
 *
 * 2. A lean start: the interpreter runs isolated and without site
 *    (-I -S: no site-packages start-up files, no editable-install path
 *    finder, no user site, no PYTHON* variables), with the directory that
 *    holds this package put first on sys.path. The launcher lives inside
 *    the package (pyvmm/_launcher), so that directory is two levels above
 *    /proc/self/exe, wherever the package is installed or checked out. A
 *    wheel also installs a copy as the scripts directory's `pyvmm` (where
 *    pip would put a Python wrapper): that copy finds the package in the
 *    interpreter's site-packages.
 *
 * The interpreter is the one the package was built for (PYVMM_PYTHON, set
 * by setup.py); PYVMM_PYTHON in the environment overrides it (tests, a
 * moved interpreter). argv becomes:
 *
 *     PYTHON -I -S -c BOOT START_NS ROOT [ARGS...]
 *
 * where START_NS is this program's start on CLOCK_BOOTTIME (the first
 * phase of --trace) and BOOT hands both to pyvmm.entry.launched().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef PYVMM_PYTHON
#define PYVMM_PYTHON "/usr/bin/python3"
#endif

static const char boot[] =
    "import sys\n"
    "start, root = sys.argv[1:3]\n"
    "del sys.argv[1:3]\n"
    "sys.argv[0] = 'pyvmm'\n"
    "if root:\n"
    "    sys.path.insert(0, root)\n"
    "else:\n"
    "    import site\n"
    "    site.main()\n"
    "from pyvmm.entry import launched\n"
    "launched(start)\n";

static void fail_with(const char *what, const char *path, const char *hint)
{
    /* A message and status 1, as any other pyvmm error (a signal pending
     * meanwhile is discarded with the process). */
    fprintf(stderr, "pyvmm: %s %s: %s%s\n", what, path, strerror(errno), hint);
    exit(1);
}

static void fail(const char *what, const char *path)
{
    fail_with(what, path, "");
}

int main(int argc, char **argv)
{
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    sigaddset(&stop, SIGUSR1);
    sigprocmask(SIG_BLOCK, &stop, NULL);

    struct timespec now;
    clock_gettime(CLOCK_BOOTTIME, &now);
    char start[32];
    snprintf(start, sizeof start, "%lld",
             (long long)now.tv_sec * 1000000000LL + now.tv_nsec);

    /* /proc/self/exe is ROOT/pyvmm/_launcher: ROOT holds the package. */
    char root[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", root, sizeof root - 1);
    if (len < 0)
        fail("cannot read", "/proc/self/exe");
    root[len] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(root, '/');
        if (slash == NULL) {
            errno = ENOENT;
            fail("cannot find the package above", root);
        }
        *slash = '\0';
    }
    if (root[0] == '\0')
        strcpy(root, "/");
    /* Installed as a command of its own (a wheel puts it in the scripts
     * directory as bin/pyvmm): the package is in site-packages, which the
     * boot code ("" as ROOT) adds as site would (a virtual environment's,
     * the .pth files of an editable install). */
    char entry[PATH_MAX + 32];
    snprintf(entry, sizeof entry, "%s/pyvmm/entry.py", root);
    int installed_as_command = access(entry, R_OK) != 0;
    /* Its interpreter is the one beside it when there is one (a virtual
     * environment's bin/), as pip's own wrappers name the interpreter that
     * installed them; else the one the package was built for. */
    char sibling[PATH_MAX + 32];
    sibling[0] = '\0';
    if (installed_as_command) {
        len = readlink("/proc/self/exe", sibling, PATH_MAX);
        sibling[len > 0 ? len : 0] = '\0';
        char *slash = strrchr(sibling, '/');
        if (slash != NULL)
            strcpy(slash, "/python3");
        if (access(sibling, X_OK) != 0)
            sibling[0] = '\0';
        root[0] = '\0';
    }

    const char *python = getenv("PYVMM_PYTHON");
    if ((python == NULL || python[0] == '\0') && sibling[0] != '\0')
        python = sibling;
    if (python == NULL || python[0] == '\0')
        python = PYVMM_PYTHON;

    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (args == NULL)
        fail("cannot start", python);
    int n = 0;
    args[n++] = (char *)python;
    args[n++] = "-I";
    args[n++] = "-S";
    args[n++] = "-c";
    args[n++] = (char *)boot;
    args[n++] = start;
    args[n++] = root;
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    execv(python, args);
    /* The interpreter moved or was removed since the build (a virtual
     * environment deleted, pyenv's version changed): PYVMM_PYTHON is how
     * to name another one. */
    fail_with("cannot start the interpreter", python, " (PYVMM_PYTHON names another)");
    return 1;
}
