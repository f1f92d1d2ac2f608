/*
 * pyvmm-oci's native front end: the calls that only read or signal a
 * container's state, without starting an interpreter.
 *
 * containerd's shim calls the runtime several times per container; an
 * interpreter's start-up costs far more than runc's whole call. This
 * program answers `state`, `start`, `kill`, `ps` and `delete` itself from
 * ROOT/ID/native, a line-based summary that pyvmm-oci's create writes
 * beside state.json (pyvmm/oci/runtime.py, write_native):
 *
 *     pyvmm-oci-native 1
 *     pid PID START_TIME        (field 22 of /proc/PID/stat)
 *     net 0|1                   (a tap to take down: delete goes to Python)
 *     leaf DIR                  (the container's cgroup, one per hierarchy)
 *     made DIR                  (directories create made, parents first)
 *     state {JSON}              (runc's state without pid and status)
 *
 * Everything else goes to the Python runtime, with the arguments as they
 * came: create, features, pack, --help, --version; any option or
 * form this program does not know; a container without the summary (one
 * made by an older pyvmm-oci); a delete that has a network to tear down; an
 * unknown signal name (Python says which names exist). A pod sandbox's
 * calls go to runc, from here (oci_runc.h). Python's messages,
 * exit statuses and log lines are the Python runtime's, word for word.
 *
 * The interpreter: PYVMM_PYTHON from the environment, else the one the
 * package was built for; the package is two levels above /proc/self/exe
 * (this program is ROOT/pyvmm/_oci).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "oci_timeline.h"

#ifndef PYVMM_PYTHON
#define PYVMM_PYTHON "/usr/bin/python3"
#endif

#define DEFAULT_ROOT "/run/pyvmm-oci"
#define NATIVE_MAX (256 * 1024)
#define MAX_DIRS 64
#define START_TIMEOUT_MS 30000
#define EMPTY_TIMEOUT_MS 5000

static const char boot[] =
    "import sys\n"
    "root = sys.argv[1]\n"
    "del sys.argv[1]\n"
    "sys.argv[0] = 'pyvmm-oci'\n"
    "sys.path.insert(0, root)\n"
    /* site-packages without site's start-up files, as pyvmm's launcher adds
     * them: the package is on sys.path already, and an editable install's
     * finder (a .pth file site runs) cost create 10-15 ms of imports. */
    "from pyvmm.entry import _site_packages\n"
    "sys.path += [p for p in _site_packages() if p not in sys.path]\n"
    "from pyvmm.oci.runtime import main\n"
    "status = main()\n"
    "import os\n"
    "try:\n"
    "    sys.stdout.flush()\n"
    "    sys.stderr.flush()\n"
    "except OSError:\n"
    "    pass\n"
    /* No interpreter tear-down: its module and object clean-up cost create
     * 15-40 ms after its work was done (the container's timeline showed
     * it); every file pyvmm-oci writes is written with os.write. */
    "os._exit(status)\n";

static int g_argc;
static char **g_argv;
static const char *g_root = DEFAULT_ROOT;
static const char *g_log;
static int g_log_json;
static long long g_begin; /* the call's begin, for the container's timeline */

/* -- the Python runtime --------------------------------------------------- */

static void python(void)
{
    char root[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", root, sizeof root - 1);
    if (len < 0)
        len = 0;
    root[len] = '\0';
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(root, '/');
        if (slash != NULL)
            *slash = '\0';
    }
    if (root[0] == '\0')
        strcpy(root, "/");
    const char *py = getenv("PYVMM_PYTHON");
    if (py == NULL || py[0] == '\0')
        py = PYVMM_PYTHON;
    char **args = calloc((size_t)g_argc + 8, sizeof *args);
    if (args == NULL) {
        fputs("pyvmm-oci: out of memory\n", stderr);
        exit(1);
    }
    int n = 0;
    args[n++] = (char *)py;
    args[n++] = "-I";
    args[n++] = "-S";
    args[n++] = "-c";
    args[n++] = (char *)boot;
    args[n++] = root;
    for (int i = 1; i < g_argc; i++)
        args[n++] = g_argv[i];
    args[n] = NULL;
    char begin[32];
    snprintf(begin, sizeof begin, "%lld", g_begin);
    setenv(OCI_TIMELINE_BEGIN_ENV, begin, 1); /* the span Python writes starts here */
    execv(py, args);
    fprintf(stderr, "pyvmm-oci: cannot start the interpreter %s: %s (PYVMM_PYTHON names another)\n",
            py, strerror(errno));
    exit(1);
}

/* -- output ---------------------------------------------------------------- */

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static FILE *open_private_append(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    fchmod(fd, 0600);
    FILE *f = fdopen(fd, "a");
    if (f == NULL)
        close(fd);
    return f;
}

static void trace(void)
{
    /* PYVMM_OCI_TRACE=FILE: each invocation's argv, as the Python runtime writes it. */
    const char *path = getenv("PYVMM_OCI_TRACE");
    if (path == NULL || path[0] == '\0')
        return;
    FILE *f = open_private_append(path);
    if (f == NULL)
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "%lld.%03ld %d [", (long long)now.tv_sec, now.tv_nsec / 1000000, (int)getpid());
    for (int i = 1; i < g_argc; i++) {
        if (i > 1)
            fputs(", ", f);
        json_string(f, g_argv[i]);
    }
    fputs("]\n", f);
    fclose(f);
}

static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int refuse(const char *fmt, ...)
{
    /* One line on stderr and, with --log, the line the shim reads. */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_log != NULL) {
        FILE *f = open_private_append(g_log);
        if (f != NULL) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            struct tm tm;
            gmtime_r(&now.tv_sec, &tm);
            char when[64];
            size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
            snprintf(when + n, sizeof when - n, ".%06ld+00:00", now.tv_nsec / 1000);
            if (g_log_json) {
                fputs("{\"level\": \"error\", \"msg\": ", f);
                json_string(f, msg);
                fputs(", \"time\": ", f);
                json_string(f, when);
                fputs("}\n", f);
            } else {
                fprintf(f, "time=\"%s\" level=error msg=\"%s\"\n", when, msg);
            }
            fclose(f);
        }
    }
    fprintf(stderr, "pyvmm-oci: %s\n", msg);
    return 1;
}

/* -- the container ----------------------------------------------------------- */

struct container {
    const char *id;
    char dir[PATH_MAX];
    char fifo[PATH_MAX + 16];
    long pid;
    char start_time[32];
    int net;
    char *leaves[MAX_DIRS];
    int nleaves;
    char *made[MAX_DIRS];
    int nmade;
    char *state; /* the JSON object */
    long vm_pid; /* the warm path's VM (the pid above is its relay's) */
    char vm_start[32];
};

static int valid_id(const char *id)
{
    /* runc's rule, no leading dot (ROOT/.runc is runc's), one directory name. */
    size_t len = strlen(id);
    if (len == 0 || len > 255 || id[0] == '.')
        return 0;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("_+,.-", *p) != NULL))
            return 0;
    return 1;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* 1: loaded; 0: not answerable here (the Python runtime's); -1: no such container. */
static int load(struct container *c, const char *id)
{
    if (!valid_id(id))
        return 0;
    c->id = id;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.runc/%s", g_root, id);
    if (is_dir(path))
        return 0; /* a pod sandbox: runc's */
    snprintf(c->dir, sizeof c->dir, "%s/%s", g_root, id);
    snprintf(c->fifo, sizeof c->fifo, "%s/exec.fifo", c->dir);
    snprintf(path, sizeof path, "%s/native", c->dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT && !is_dir(c->dir) ? -1 : 0;
    char *text = malloc(NATIVE_MAX + 1);
    ssize_t len = text == NULL ? -1 : read(fd, text, NATIVE_MAX + 1);
    close(fd);
    if (len <= 0 || len > NATIVE_MAX)
        return 0;
    text[len] = '\0';
    int version = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "pyvmm-oci-native ", 17) == 0)
            version = atoi(line + 17);
        else if (strncmp(line, "pid ", 4) == 0)
            sscanf(line + 4, "%ld %31s", &c->pid, c->start_time);
        else if (strncmp(line, "net ", 4) == 0)
            c->net = atoi(line + 4);
        else if (strncmp(line, "leaf ", 5) == 0 && c->nleaves < MAX_DIRS)
            c->leaves[c->nleaves++] = line + 5;
        else if (strncmp(line, "made ", 5) == 0 && c->nmade < MAX_DIRS)
            c->made[c->nmade++] = line + 5;
        else if (strncmp(line, "state {", 7) == 0)
            c->state = line + 6;
        else if (strncmp(line, "vm ", 3) == 0)
            sscanf(line + 3, "%ld %31s", &c->vm_pid, c->vm_start);
        else
            return 0;
    }
    return version == 1 && c->state != NULL ? 1 : 0;
}

static int alive(const struct container *c)
{
    /* Same pid, same start time, not a zombie: pyvmm-oci's rule. */
    if (c->pid <= 0)
        return 0;
    char path[64], stat_text[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", c->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, stat_text, sizeof stat_text - 1);
    close(fd);
    if (len <= 0)
        return 0;
    stat_text[len] = '\0';
    char *p = strrchr(stat_text, ')');
    if (p == NULL || p[1] != ' ')
        return 0;
    p += 2;
    if (*p == 'Z' || *p == 'X')
        return 0;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    size_t n = strcspn(p, " ");
    return n == strlen(c->start_time) && strncmp(p, c->start_time, n) == 0;
}

static const char *status(const struct container *c)
{
    if (!alive(c))
        return "stopped";
    return access(c->fifo, F_OK) == 0 ? "created" : "running";
}

static int sandbox_bundle(const char *bundle_abs); /* pod sandboxes: oci_runc.h */
static int runc_owns(const char *id);
static void runc(int command) __attribute__((noreturn));

#include "oci_warm.h" /* create's warm path, on the helpers above */
#include "oci_runc.h"

/* -- commands ---------------------------------------------------------------- */

static int cmd_state(struct container *c)
{
    const char *st = status(c);
    printf("{\"pid\": %ld, \"status\": \"%s\", %s\n", strcmp(st, "stopped") ? c->pid : 0L, st,
           c->state + 1);
    return 0;
}

static int cmd_start(struct container *c)
{
    const char *st = status(c);
    if (strcmp(st, "created") != 0)
        return refuse("cannot start a container that is %s", st);
    int fd = open(c->fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return refuse("%s: %s", strerror(errno), c->fifo);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char byte;
        if (poll(&p, 1, 50) > 0 && read(fd, &byte, 1) == 1)
            break;
        if (!alive(c)) {
            close(fd);
            return refuse("the container's process ended before it started");
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >
            START_TIMEOUT_MS) {
            close(fd);
            return refuse("the container's process did not take the start signal");
        }
        usleep(1000); /* no writer yet: the FIFO reads as end of file */
    }
    close(fd);
    unlink(c->fifo);
    return 0;
}

static const struct {
    const char *name;
    int number;
} signals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT}, {"IOT", SIGIOT},   {"BUS", SIGBUS},   {"FPE", SIGFPE},   {"KILL", SIGKILL},
    {"USR1", SIGUSR1}, {"SEGV", SIGSEGV}, {"USR2", SIGUSR2}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},
    {"TERM", SIGTERM}, {"CHLD", SIGCHLD}, {"CONT", SIGCONT}, {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU}, {"URG", SIGURG},   {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},
    {"POLL", SIGPOLL}, {"PWR", SIGPWR}, {"SYS", SIGSYS},
};

/* The signal's number, or -1: a name only Python knows the message for. */
static int parse_signal(const char *text)
{
    if (text[0] != '\0' && strspn(text, "0123456789") == strlen(text) && strlen(text) < 10)
        return atoi(text);
    char name[16];
    size_t n = strlen(text);
    if (n >= sizeof name)
        return -1;
    for (size_t i = 0; i <= n; i++)
        name[i] = (text[i] >= 'a' && text[i] <= 'z') ? (char)(text[i] - 32) : text[i];
    const char *bare = strncmp(name, "SIG", 3) == 0 ? name + 3 : name;
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        if (strcmp(bare, signals[i].name) == 0)
            return signals[i].number;
    return -1;
}

static void signal_cgroup(const struct container *c, int signum)
{
    /* Every process left in the container's cgroup (runc's kill --all). */
    for (int i = 0; i < c->nleaves; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/cgroup.procs", c->leaves[i]);
        FILE *f = fopen(path, "re");
        if (f == NULL)
            continue;
        long pid;
        while (fscanf(f, "%ld", &pid) == 1)
            if (pid > 0)
                kill((pid_t)pid, signum);
        fclose(f);
    }
}

static int cmd_kill(struct container *c, int signum, int all)
{
    if (!alive(c))
        return refuse("container not running");
    if (kill((pid_t)c->pid, signum) != 0) {
        if (errno == ESRCH)
            return refuse("container not running");
        return refuse("[Errno %d] %s", errno, strerror(errno)); /* as Python's OSError */
    }
    if (all)
        signal_cgroup(c, signum);
    if (signum == SIGKILL && c->vm_pid > 0) { /* the one signal the relay cannot pass on */
        struct container vm = {.pid = c->vm_pid};
        snprintf(vm.start_time, sizeof vm.start_time, "%s", c->vm_start);
        if (alive(&vm))
            kill((pid_t)vm.pid, SIGKILL);
    }
    return 0;
}

static long elapsed_ms(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

static int cmd_delete(struct container *c, int force)
{
    if (strcmp(status(c), "running") == 0 && !force)
        return refuse("cannot delete a running container (use --force)");
    if (alive(c))
        kill((pid_t)c->pid, SIGKILL);
    signal_cgroup(c, SIGKILL);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < c->nleaves; i++) {
        while (rmdir(c->leaves[i]) != 0 && errno != ENOENT) {
            if (errno != EBUSY || elapsed_ms(&t0) > EMPTY_TIMEOUT_MS)
                return refuse("cannot remove the cgroup %s: %s", c->leaves[i], strerror(errno));
            signal_cgroup(c, SIGKILL);
            usleep(1000); /* a killed VM takes a few ms to let go of its memory and KVM */
        }
    }
    for (int i = c->nmade - 1; i >= 0; i--) {
        int leaf = 0;
        for (int j = 0; j < c->nleaves; j++)
            leaf |= strcmp(c->made[i], c->leaves[j]) == 0;
        if (!leaf)
            rmdir(c->made[i]); /* another container's now, or gone: left as it is */
    }
    oci_timeline_finish(c->dir, g_begin);
    /* The state directory: files only (state, summary, FIFO, timeline). */
    DIR *d = opendir(c->dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(c->dir);
    return 0;
}

static int cmd_ps(struct container *c, int json)
{
    /* The container's one process, pyvmm, while it lives. */
    int up = alive(c);
    if (json)
        up ? printf("[%ld]\n", c->pid) : printf("[]\n");
    else
        up ? printf("PID\n%ld\n", c->pid) : printf("PID\n");
    return 0;
}

/* -- command line -------------------------------------------------------------- */

/* A global option's value ("--opt VALUE" or "--opt=VALUE"), advancing *i. */
static const char *option_value(const char *opt, int *i)
{
    const char *arg = g_argv[*i];
    size_t n = strlen(opt);
    if (strncmp(arg, opt, n) != 0)
        return NULL;
    if (arg[n] == '=')
        return arg + n + 1;
    if (arg[n] == '\0' && *i + 1 < g_argc)
        return g_argv[++*i];
    return NULL;
}

int main(int argc, char **argv)
{
    g_begin = oci_timeline_now();
    g_argc = argc;
    g_argv = argv;
    int i = 1, debug = 0, systemd = 0;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *value;
        if ((value = option_value("--root", &i)) != NULL)
            g_root = value;
        else if ((value = option_value("--log-format", &i)) != NULL) {
            if (strcmp(value, "json") && strcmp(value, "text"))
                python();
            g_log_json = strcmp(value, "json") == 0;
        } else if ((value = option_value("--log", &i)) != NULL)
            g_log = value;
        else if (option_value("--rootless", &i) || option_value("--criu", &i))
            ;
        else if (!strcmp(argv[i], "--debug"))
            debug = 1;
        else if (!strcmp(argv[i], "--systemd-cgroup"))
            systemd = 1;
        else
            python(); /* --help, --version, anything else */
    }
    if (i >= argc || g_root[0] == '\0' || strlen(g_root) > PATH_MAX / 2)
        python();
    int command_at = i;
    const char *command = argv[i++];
    if (!strcmp(command, "create")) {
        int rc = warm_create(argc, argv, i, debug, systemd); /* or the cold one, Python's */
        if (valid_id(argv[argc - 1])) { /* the warm create's span (the cold one writes its own) */
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s/%s", g_root, argv[argc - 1]);
            oci_timeline_span(dir, "create", g_begin, rc);
        }
        return rc;
    }
    int flag = 0, json = 0;
    const char *words[2] = {NULL, NULL};
    int nwords = 0;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(command, "ps") && nwords == 0 && (!strcmp(arg, "--format") || !strcmp(arg, "-f")) &&
            i + 1 < argc && (!strcmp(argv[i + 1], "json") || !strcmp(argv[i + 1], "table")))
            json = !strcmp(argv[++i], "json");
        else if ((!strcmp(command, "kill") && (!strcmp(arg, "--all") || !strcmp(arg, "-a"))) ||
            (!strcmp(command, "delete") && (!strcmp(arg, "--force") || !strcmp(arg, "-f"))))
            flag = 1;
        else if (arg[0] == '-' || nwords == 2)
            python();
        else
            words[nwords++] = arg;
    }
    int is_kill = !strcmp(command, "kill");
    if (strcmp(command, "state") && strcmp(command, "start") && !is_kill &&
        strcmp(command, "delete") && strcmp(command, "ps"))
        python();
    if (nwords != 1 + (is_kill && nwords == 2) || (flag && !is_kill && strcmp(command, "delete")))
        python();
    int signum = SIGTERM;
    if (is_kill && nwords == 2 && (signum = parse_signal(words[1])) < 0)
        python();
    if (valid_id(words[0]) && runc_owns(words[0]))
        runc(command_at);
    struct container c = {0};
    int found = load(&c, words[0]);
    if (found == 0)
        python();
    if (found > 0 && !strcmp(command, "delete") && c.net)
        python(); /* the tap and the redirects: pyroute2's */
    trace();
    if (found < 0)
        return refuse("container %s does not exist", words[0]);
    int rc;
    if (!strcmp(command, "state"))
        rc = cmd_state(&c);
    else if (!strcmp(command, "start"))
        rc = cmd_start(&c);
    else if (is_kill)
        rc = cmd_kill(&c, signum, flag);
    else if (!strcmp(command, "ps"))
        rc = cmd_ps(&c, json);
    else
        rc = cmd_delete(&c, flag); /* done: its directory, and the timeline, are gone */
    oci_timeline_span(c.dir, command, g_begin, rc);
    return rc;
}
