/*
 * pyvmm-oci's warm create, in the native front end (included once, by
 * oci_front.c, after its helpers: python(), refuse(), json_string(),
 * valid_id(), is_dir(), g_root).
 *
 * With a launcher configured (the annotation org.pyvmm.launcher in
 * config.json, else `launcher = PATH` in /etc/pyvmm/oci.conf or the file
 * PYVMM_OCI_CONFIG names), create does not start an interpreter: it forks
 * the relay, whose pid goes to the pid file, and the relay asks the
 * running `pyvmm serve` for the container's VM (POST /v1/containers:
 * the launcher reads the bundle, makes the cgroup and the state, and
 * forks the VM, which sets itself up to right before its first
 * instruction and waits; pyvmm/oci/warm.py). create returns once the VM
 * is forked and in the container's cgroup.
 *
 * The relay then is what the shim sees of the container: it blocks
 * opening ROOT/ID/exec.fifo for writing, as the cold path's process does;
 * `start` takes its byte, and only then does the relay send POST
 * /v1/vms/VM/start with the container's stdio (SCM_RIGHTS; the VM writes
 * to them itself) and wait on that connection for the VM's end. It exits
 * with the guest's status. Signals sent to it go on to the VM (a pidfd
 * taken while the VM waits); SIGKILL, which it cannot catch, `kill`
 * sends to the VM as well.
 *
 * A launcher that is not there (no socket, refused, not root's or ours)
 * a container the warm path does not take (the launcher answers 501: a
 * net or block device) or a launcher at its limit or
 * stopping (503) falls back to the cold create,
 * with one line in the shim's --log. An explicit "" or "none" annotation
 * asks for the cold path without a line.
 */
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#define WARM_CONFIG "/etc/pyvmm/oci.conf"
#define WARM_ANNOTATION "org.pyvmm.launcher"
#define CONFIG_MAX (4 * 1024 * 1024)
#define ANSWER_MAX (256 * 1024)

/* -- a small JSON reader: enough to find a member of an object --------------- */

static const char *json_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the string at p (at its opening quote); its text decoded into out
 * (cap bytes, NUL-terminated, \u escapes above ASCII as '?'), or NULL. */
static const char *json_str(const char *p, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    if (p >= end || *p != '"')
        return NULL;
    for (p++; p < end && *p != '"'; p++) {
        char c = *p;
        if ((unsigned char)c < 0x20)
            return NULL;
        if (c == '\\') {
            if (++p >= end)
                return NULL;
            switch (*p) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 1; k <= 4; k++) {
                    char h = p + k < end ? p[k] : 0;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                }
                if (v > 0xffff)
                    return NULL;
                p += 4;
                c = v < 0x80 && v != 0 ? (char)v : '?';
                break;
            }
            default: c = *p; /* \" \\ \/ */
            }
        }
        if (out != NULL && n + 1 < cap)
            out[n++] = c;
    }
    if (out != NULL && cap > 0)
        out[n] = '\0';
    return p < end ? p + 1 : NULL;
}

/* Past the value at p, or NULL (depth-bounded, as the Python reader). */
static const char *json_skip(const char *p, const char *end, int depth)
{
    p = json_ws(p, end);
    if (p >= end || depth > 32)
        return NULL;
    if (*p == '"')
        return json_str(p, end, NULL, 0);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = json_ws(p + 1, end);
        if (p < end && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if ((p = json_str(json_ws(p, end), end, NULL, 0)) == NULL)
                    return NULL;
                p = json_ws(p, end);
                if (p >= end || *p++ != ':')
                    return NULL;
            }
            if ((p = json_skip(p, end, depth + 1)) == NULL)
                return NULL;
            p = json_ws(p, end);
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            return p < end && *p == close ? p + 1 : NULL;
        }
    }
    const char *start = p;
    while (p < end && (strchr("+-.eE", *p) != NULL || (*p >= '0' && *p <= '9') ||
                       (*p >= 'a' && *p <= 'z')))
        p++;
    return p > start ? p : NULL;
}

/* The value of member `key` of the object at p (its first), or NULL. */
static const char *json_get(const char *p, const char *end, const char *key)
{
    p = json_ws(p, end);
    if (p >= end || *p != '{')
        return NULL;
    p = json_ws(p + 1, end);
    char name[256];
    while (p < end && *p == '"') {
        if ((p = json_str(p, end, name, sizeof name)) == NULL)
            return NULL;
        p = json_ws(p, end);
        if (p >= end || *p++ != ':')
            return NULL;
        p = json_ws(p, end);
        if (strcmp(name, key) == 0)
            return p;
        if ((p = json_skip(p, end, 1)) == NULL)
            return NULL;
        p = json_ws(p, end);
        if (p < end && *p == ',')
            p = json_ws(p + 1, end);
    }
    return NULL;
}

/* A string member's text into out; 1 if it is one. */
static int json_get_str(const char *obj, const char *end, const char *key, char *out, size_t cap)
{
    const char *v = json_get(obj, end, key);
    return v != NULL && json_str(v, end, out, cap) != NULL;
}

/* An integer member; `fallback` if it is absent or not one. */
static long json_get_int(const char *obj, const char *end, const char *key, long fallback)
{
    const char *v = json_get(obj, end, key);
    if (v == NULL || v >= end || !(*v == '-' || (*v >= '0' && *v <= '9')))
        return fallback;
    return strtol(v, NULL, 10);
}

/* -- where the launcher is ---------------------------------------------------- */

static char *read_small(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *text = malloc(max + 1);
    size_t n = 0;
    ssize_t got = 0;
    while (text != NULL && n <= max && (got = read(fd, text + n, max + 1 - n)) > 0)
        n += (size_t)got;
    close(fd);
    if (text == NULL || got < 0 || n > max) {
        free(text);
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}

/* `launcher = PATH` from the configuration file, or NULL. */
static char *configured_launcher(void)
{
    const char *path = getenv("PYVMM_OCI_CONFIG");
    size_t len;
    char *text = read_small(path != NULL && path[0] ? path : WARM_CONFIG, 64 * 1024, &len);
    if (text == NULL)
        return NULL;
    char *found = NULL;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        line += strspn(line, " \t");
        if (strncmp(line, "launcher", 8) != 0)
            continue;
        char *value = line + 8 + strspn(line + 8, " \t");
        if (*value != '=')
            continue;
        value += 1 + strspn(value + 1, " \t");
        size_t n = strcspn(value, " \t\r#");
        value[n] = '\0';
        free(found);
        found = n ? strdup(value) : NULL;
    }
    free(text);
    return found;
}

struct warm_args {
    const char *bundle, *pid_file, *console, *id;
    char bundle_abs[PATH_MAX], root_abs[PATH_MAX], launcher[PATH_MAX], vm[64];
    int debug, systemd;
};

/* 1: the warm path is asked for (launcher set); 0: cold (Python's). */
static int warm_wanted(struct warm_args *w)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", w->bundle_abs);
    size_t len;
    char *config = read_small(path, CONFIG_MAX, &len);
    if (config == NULL)
        return 0; /* Python says what is wrong with it */
    const char *end = config + len, *notes = json_get(config, end, "annotations");
    char value[PATH_MAX];
    int wanted = 0, annotated = 0;
    if (notes != NULL) /* (a pod sandbox went to runc before this) */
        annotated = json_get_str(notes, end, WARM_ANNOTATION, value, sizeof value);
    free(config);
    if (annotated) {
        wanted = value[0] != '\0' && strcmp(value, "none") != 0;
        snprintf(w->launcher, sizeof w->launcher, "%s", value);
    } else {
        char *conf = configured_launcher();
        wanted = conf != NULL && strlen(conf) < sizeof w->launcher;
        if (wanted)
            snprintf(w->launcher, sizeof w->launcher, "%s", conf);
        free(conf);
    }
    return wanted && w->launcher[0] == '/';
}

/* -- talking to the launcher --------------------------------------------------- */

/* A connection to a launcher of root or of this user, or -1 with why. */
static int launcher_connect(const char *path, char *why, size_t cap)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(why, cap, "the path is too long for a socket");
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(why, cap, "cannot connect: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct ucred cred;
    socklen_t n = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0 ||
        (cred.uid != 0 && cred.uid != geteuid())) {
        snprintf(why, cap, "the process listening there is uid %d, neither root nor this user",
                 (int)cred.uid);
        close(fd);
        return -1;
    }
    return fd;
}

/* Send one request (with fds, if any); read the answer until the launcher
 * closes. The status, or -1; the body in *body (malloc'd). */
static int launcher_call(int fd, const char *target, const char *json, const int *fds, int nfds,
                         char **body)
{
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     target, strlen(json));
    struct iovec iov[2] = {{head, (size_t)n}, {(void *)json, strlen(json)}};
    char control[CMSG_SPACE(2 * sizeof(int))] = {0};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    if (nfds > 0) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    ssize_t sent;
    while ((sent = sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (sent < 0)
        return -1;
    size_t total = (size_t)n + strlen(json);
    if ((size_t)sent < total) { /* the rest, without the fds (sent once) */
        const char *all = NULL;
        char *joined = malloc(total);
        if (joined == NULL)
            return -1;
        memcpy(joined, head, (size_t)n);
        memcpy(joined + n, json, strlen(json));
        all = joined;
        for (size_t at = (size_t)sent; at < total;) {
            ssize_t k = send(fd, all + at, total - at, MSG_NOSIGNAL);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                free(joined);
                return -1;
            }
            at += (size_t)k;
        }
        free(joined);
    }
    char *answer = malloc(ANSWER_MAX + 1);
    size_t len = 0;
    while (answer != NULL && len < ANSWER_MAX) {
        ssize_t k = read(fd, answer + len, ANSWER_MAX - len);
        if (k < 0 && errno == EINTR)
            continue; /* a signal passed on to the VM: its end is still to come */
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    if (answer == NULL || len < 12 || strncmp(answer, "HTTP/1.1 ", 9) != 0) {
        free(answer);
        return -1;
    }
    answer[len] = '\0';
    int status = atoi(answer + 9);
    char *start = strstr(answer, "\r\n\r\n");
    *body = strdup(start != NULL ? start + 4 : "");
    free(answer);
    return status;
}

/* The one line of an error answer, without the launcher's "pyvmm: ". */
static void answer_error(const char *body, int status, char *out, size_t cap)
{
    char line[1024];
    if (body == NULL || !json_get_str(body, body + strlen(body), "error", line, sizeof line))
        snprintf(line, sizeof line, "the warm launcher answered %d", status);
    snprintf(out, cap, "%s", strncmp(line, "pyvmm: ", 7) == 0 ? line + 7 : line);
}

/* -- the relay ------------------------------------------------------------------ */

static volatile sig_atomic_t g_vm_pidfd = -1, g_started;

static void pass_on(int signum)
{
    if (g_vm_pidfd >= 0)
        syscall(SYS_pidfd_send_signal, (int)g_vm_pidfd, signum, NULL, 0);
    if (!g_started) /* as the cold path's waiting process: ended by it */
        _exit(128 + signum);
}

static void take_signals(void)
{
    static const int kept[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM,
                               SIGTERM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGPWR};
    struct sigaction sa = {.sa_handler = pass_on}; /* no SA_RESTART: a read sees EINTR */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        sigaction(kept[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* What the relay tells create: "ok", "cold LINE" or "error LINE". */
static void tell(int fd, const char *what, const char *line)
{
    char msg[1200];
    int n = snprintf(msg, sizeof msg, "%s%s%s", what, line[0] ? " " : "", line);
    if (write(fd, msg, (size_t)n) < 0) {
        /* create is gone: nothing to tell */
    }
    close(fd);
}

/* A pty whose master goes to the console socket (as the cold path's); the slave. */
static int console_pty(const char *sock_path, char *why, size_t cap)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
        snprintf(why, cap, "cannot make a pty: %s", strerror(errno));
        return -1;
    }
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock_path);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (slave < 0 || sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(why, cap, "console socket %s: %s", sock_path, strerror(errno));
        close(master);
        return -1;
    }
    char name[] = "/dev/ptmx";
    struct iovec iov = {name, sizeof name - 1};
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &master, sizeof(int));
    int ok = sendmsg(sock, &msg, MSG_NOSIGNAL) >= 0;
    close(sock);
    close(master);
    if (!ok) {
        snprintf(why, cap, "console socket %s: %s", sock_path, strerror(errno));
        close(slave);
        return -1;
    }
    return slave;
}

static void body_append(char *body, size_t cap, const char *key, const char *value)
{
    /* "key": "value", JSON-escaped (json_string writes to a FILE). */
    size_t n = strlen(body);
    FILE *f = fmemopen(body + n, cap - n, "w");
    if (f == NULL)
        return;
    fprintf(f, "%s\"%s\": ", n > 1 ? ", " : "", key);
    json_string(f, value);
    fclose(f);
}

static void relay(struct warm_args *w, int report) __attribute__((noreturn));

static void relay(struct warm_args *w, int report)
{
    char why[1024] = "", body[3 * PATH_MAX] = "{";
    /* Nothing of the shim's but stdio (its own sockets, say). */
    if (report > 3)
        syscall(SYS_close_range, 3U, (unsigned)report - 1, 0U);
    syscall(SYS_close_range, (unsigned)report + 1, ~0U, 0U);
    take_signals();
    /* Connected from here: the launcher takes the peer's pid for the relay's. */
    int sock = launcher_connect(w->launcher, why, sizeof why);
    if (sock < 0) {
        tell(report, "cold", why);
        _exit(1);
    }
    int out = 1, err = 2;
    if (w->console != NULL) {
        int pty = console_pty(w->console, why, sizeof why);
        if (pty < 0) {
            tell(report, "error", why);
            _exit(1);
        }
        /* The terminal is the container's stdio now, as the cold path's
         * process makes it: create's own (a pipe the shim reads to its
         * end with a terminal) is let go, or the shim would wait on it. */
        for (int fd = 0; fd < 3; fd++)
            dup2(pty, fd);
        close(pty);
    }
    body_append(body, sizeof body, "bundle", w->bundle_abs);
    body_append(body, sizeof body, "id", w->id);
    body_append(body, sizeof body, "root", w->root_abs);
    body_append(body, sizeof body, "vm", w->vm);
    snprintf(body + strlen(body), sizeof body - strlen(body),
             ", \"systemd_cgroup\": %s, \"debug\": %s}", w->systemd ? "true" : "false",
             w->debug ? "true" : "false");
    char *answer = NULL;
    int status = launcher_call(sock, "/v1/containers", body, NULL, 0, &answer);
    close(sock);
    if (status != 201) {
        if (status < 0)
            snprintf(why, sizeof why, "the warm launcher %.900s closed without an answer", w->launcher);
        else
            answer_error(answer, status, why, sizeof why);
        /* 501: not for the warm path; 503: the launcher is full or stopping */
        tell(report, status == 501 || status == 503 ? "cold" : "error", why);
        _exit(1);
    }
    long vm_pid = json_get_int(answer, answer + strlen(answer), "pid", -1);
    free(answer);
    g_vm_pidfd = vm_pid > 0 ? (int)syscall(SYS_pidfd_open, (pid_t)vm_pid, 0) : -1;
    tell(report, "ok", "");
    /* Held until start takes the byte (the cold path's FIFO, the same start). */
    char fifo[PATH_MAX + 32];
    snprintf(fifo, sizeof fifo, "%s/%s/exec.fifo", w->root_abs, w->id);
    int fd;
    while ((fd = open(fifo, O_WRONLY | O_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (fd < 0 || write(fd, "0", 1) != 1) {
        dprintf(err, "pyvmm-oci: cannot take the start signal: %s\n", strerror(errno));
        _exit(1);
    }
    close(fd);
    g_started = 1;
    sock = launcher_connect(w->launcher, why, sizeof why);
    if (sock < 0) {
        dprintf(err, "pyvmm-oci: the warm launcher %s: %s\n", w->launcher, why);
        _exit(1);
    }
    char target[128];
    snprintf(target, sizeof target, "/v1/vms/%s/start", w->vm);
    int fds[2] = {out, err};
    status = launcher_call(sock, target, "{\"wait\": true}", fds, 2, &answer);
    if (status < 0) {
        dprintf(err, "pyvmm-oci: the warm launcher %s closed without the VM's end\n", w->launcher);
        _exit(1);
    }
    long exit_status = json_get_int(answer, answer + strlen(answer), "exit_status", -1);
    if (status != 200) {
        answer_error(answer, status, why, sizeof why);
        dprintf(err, "pyvmm-oci: %s\n", why);
    }
    _exit(exit_status >= 0 && exit_status <= 255 ? (int)exit_status : 1);
}

/* -- create ----------------------------------------------------------------------- */

static void warm_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line in the shim's --log (not an error: the cold path goes on). */
static void warm_log(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    FILE *f = g_log != NULL ? open_private_append(g_log) : NULL;
    if (f == NULL)
        return;
    if (g_log_json) {
        fputs("{\"level\": \"warning\", \"msg\": ", f);
        json_string(f, msg);
        fputs("}\n", f);
    } else {
        fprintf(f, "level=warning msg=\"%s\"\n", msg);
    }
    fclose(f);
}

static int absolute(const char *path, char *out, size_t cap)
{
    if (path[0] == '/')
        return snprintf(out, cap, "%s", path) < (int)cap;
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == NULL)
        return 0;
    return snprintf(out, cap, "%s/%s", cwd, path) < (int)cap;
}

/* `create`'s arguments (argv[i] on): the warm path, or python() for the
 * cold one; returns create's exit status. */
static int warm_create(int argc, char **argv, int i, int debug, int systemd)
{
    const int i_command = i - 1; /* "create" */
    struct warm_args w = {.bundle = ".", .debug = debug, .systemd = systemd};
    for (; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        const char **slot = NULL;
        static const struct {
            const char *name, *alias;
            int which;
        } opts[] = {{"--bundle", "-b", 0}, {"--pid-file", NULL, 1}, {"--console-socket", NULL, 2}};
        for (size_t k = 0; k < 3 && slot == NULL; k++) {
            size_t n = strlen(opts[k].name);
            const char **target = opts[k].which == 0 ? &w.bundle
                                  : opts[k].which == 1 ? &w.pid_file : &w.console;
            if (!strcmp(arg, opts[k].name) || (opts[k].alias && !strcmp(arg, opts[k].alias))) {
                if (i + 1 >= argc)
                    python();
                slot = target, value = argv[++i];
            } else if (!strncmp(arg, opts[k].name, n) && arg[n] == '=') {
                slot = target, value = arg + n + 1;
            }
        }
        if (slot != NULL)
            *slot = value;
        else if (!strcmp(arg, "--no-pivot") || !strcmp(arg, "--no-new-keyring") ||
                 !strcmp(arg, "--preserve-fds=0"))
            ;
        else if (arg[0] == '-' || w.id != NULL)
            python(); /* anything else: the Python runtime's word on it */
        else
            w.id = arg;
    }
    if (w.id == NULL || !valid_id(w.id) || !absolute(w.bundle, w.bundle_abs, sizeof w.bundle_abs) ||
        !absolute(g_root, w.root_abs, sizeof w.root_abs))
        python();
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.runc/%s", g_root, w.id);
    if (is_dir(path) || sandbox_bundle(w.bundle_abs))
        runc(i_command);
    if (!warm_wanted(&w))
        python();
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    snprintf(w.vm, sizeof w.vm, "oci-%d-%lld", (int)getpid(),
             (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    trace();
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0)
        return refuse("cannot make a pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return refuse("cannot fork the relay: %s", strerror(errno));
    if (pid == 0) {
        close(report[0]);
        relay(&w, report[1]);
    }
    close(report[1]);
    char msg[1200];
    size_t len = 0;
    ssize_t got;
    while (len < sizeof msg - 1 &&
           ((got = read(report[0], msg + len, sizeof msg - 1 - len)) > 0 || (got < 0 && errno == EINTR)))
        len += got > 0 ? (size_t)got : 0;
    msg[len] = '\0';
    close(report[0]);
    if (strcmp(msg, "ok") == 0) {
        if (w.pid_file != NULL) {
            int fd = open(w.pid_file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0) {
                kill(pid, SIGKILL);
                return refuse("%s: %s", strerror(errno), w.pid_file);
            }
            fchmod(fd, 0600);
            dprintf(fd, "%d", (int)pid);
            close(fd);
        }
        return 0; /* the relay goes on: the shim, a subreaper, inherits it */
    }
    waitpid(pid, NULL, 0);
    if (strncmp(msg, "cold ", 5) == 0) {
        warm_log("the warm launcher %s: %s: a cold start", w.launcher, msg + 5);
        python();
    }
    if (strncmp(msg, "error ", 6) == 0)
        return refuse("%s", msg + 6);
    return refuse("the warm path's relay ended before the launcher answered");
}
