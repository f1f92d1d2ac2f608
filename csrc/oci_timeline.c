/*
 * A container's start-up timeline: the native front end's spans and its
 * delete's merge (oci_timeline.h; the same rules as pyvmm/oci/timeline.py,
 * which writes the Python runtime's spans and merges for its delete).
 */
#define _GNU_SOURCE
#include "oci_timeline.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "pyvmm-oci-timeline 1 "
#define READ_MAX (1 << 20)
#define MAX_CALLS 64
#define CALL_CAT "\"cat\":\"pyvmm-oci.call\""
#define RUNTIME_PID 1
#define CONTAINERD_PID 2

long long oci_timeline_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* A call's event, as timeline.event writes it (the name is a command's). */
static int call_event(char *buf, size_t size, const char *name, long long begin, long long end,
                      int status)
{
    long long dur = end > begin ? end - begin : 0;
    return snprintf(buf, size,
                    "{\"name\":\"%s\"," CALL_CAT ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
                    "\"pid\":%d,\"tid\":%d,\"args\":{\"pid\":%d,\"status\":%d,"
                    "\"runtime\":\"native\"}}",
                    name, begin / 1000.0, dur / 1000.0, RUNTIME_PID, (int)getpid(), (int)getpid(),
                    status);
}

void oci_timeline_span(const char *dir, const char *name, long long begin_ns, int status)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/timeline", dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return; /* no timeline asked for: the usual case, one failed open */
    char line[512];
    int n = call_event(line, sizeof line - 1, name, begin_ns, oci_timeline_now(), status);
    if (n > 0 && (size_t)n < sizeof line - 1) {
        line[n++] = '\n';
        if (write(fd, line, (size_t)n) != n) {
            /* a full disk: the timeline lacks this call, the call itself is done */
        }
    }
    close(fd);
}

/* A file of the state directory, NUL-terminated (NULL: absent or too large). */
static char *slurp(const char *dir, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *text = malloc(READ_MAX + 1);
    size_t len = 0;
    ssize_t got;
    while (text != NULL && len <= READ_MAX && (got = read(fd, text + len, READ_MAX + 1 - len)) > 0)
        len += (size_t)got;
    close(fd);
    if (text == NULL || len > READ_MAX) {
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* A number after `key` in an event's line (its first occurrence is the
 * key's: a quote inside a JSON string is escaped). */
static const char *number_after(const char *line, const char *key, double *value)
{
    const char *p = strstr(line, key);
    if (p == NULL)
        return NULL;
    p += strlen(key);
    char *end;
    *value = strtod(p, &end);
    return end == p ? NULL : end;
}

struct call {
    char name[32];
    double ts, end;
};

struct merge {
    FILE *out;
    int first;
    struct call calls[MAX_CALLS];
    int ncalls;
};

static void emit(struct merge *m, const char *line, size_t len)
{
    fputs(m->first ? "" : ",\n", m->out);
    fwrite(line, 1, len, m->out);
    m->first = 0;
}

static void note_call(struct merge *m, const char *line)
{
    double ts, dur;
    const char *name = line + strlen("{\"name\":\"");
    if (m->ncalls == MAX_CALLS || strncmp(line, "{\"name\":\"", 9) != 0 ||
        strstr(line, CALL_CAT) == NULL || !number_after(line, "\"ts\":", &ts) ||
        !number_after(line, "\"dur\":", &dur))
        return;
    struct call *c = &m->calls[m->ncalls++];
    size_t n = strcspn(name, "\"");
    snprintf(c->name, sizeof c->name, "%.*s", (int)(n < sizeof c->name ? n : sizeof c->name - 1),
             name);
    c->ts = ts;
    c->end = ts + dur;
}

/* The VM's events, shifted from CLOCK_BOOTTIME (ts from start_ns) to
 * CLOCK_MONOTONIC; pyvmm writes one event per line. */
static void emit_vm(struct merge *m, char *vm)
{
    double start_ns;
    if (vm == NULL || !number_after(vm, "\"start_ns\":", &start_ns))
        return; /* the VM was killed before it wrote its timeline */
    struct timespec boot;
    clock_gettime(CLOCK_BOOTTIME, &boot);
    long long offset = (long long)boot.tv_sec * 1000000000LL + boot.tv_nsec - oci_timeline_now();
    double shift = (start_ns - (double)offset) / 1000.0;
    for (char *line = strtok(vm, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "{\"name\":", 8) != 0)
            continue;
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == ',')
            line[--len] = '\0';
        double ts;
        const char *rest = number_after(line, "\"ts\":", &ts);
        if (rest == NULL) {
            emit(m, line, len);
            continue;
        }
        const char *key = strstr(line, "\"ts\":") + 5;
        char shifted[64];
        int n = snprintf(shifted, sizeof shifted, "%.3f", ts + shift);
        emit(m, line, (size_t)(key - line));
        fwrite(shifted, 1, (size_t)n, m->out);
        fputs(rest, m->out);
    }
}

static void emit_gaps_and_names(struct merge *m)
{
    char line[512];
    for (int i = 1; i < m->ncalls; i++) {
        const struct call *a = &m->calls[i - 1], *b = &m->calls[i];
        if (b->ts <= a->end)
            continue;
        int n = snprintf(line, sizeof line,
                         "{\"name\":\"between calls\",\"cat\":\"containerd\",\"ph\":\"X\","
                         "\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":2,"
                         "\"args\":{\"after\":\"%s\",\"before\":\"%s\"}}",
                         a->end, b->ts - a->end, CONTAINERD_PID, a->name, b->name);
        emit(m, line, (size_t)n);
    }
    static const struct {
        int pid, tid;
        const char *kind, *name;
    } names[] = {
        {RUNTIME_PID, RUNTIME_PID, "process_name", "pyvmm-oci (the runtime's calls)"},
        {CONTAINERD_PID, CONTAINERD_PID, "process_name", "containerd and its shim"},
        {CONTAINERD_PID, 1, "thread_name", "the shim's start"},
        {CONTAINERD_PID, 2, "thread_name", "between calls"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int n = snprintf(line, sizeof line,
                         "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                         "\"args\":{\"name\":\"%s\"}}",
                         names[i].kind, names[i].pid, names[i].tid, names[i].name);
        emit(m, line, (size_t)n);
    }
}

void oci_timeline_finish(const char *dir, long long begin_ns)
{
    char *log = slurp(dir, "timeline");
    if (log == NULL || strncmp(log, MAGIC, strlen(MAGIC)) != 0) {
        free(log);
        return;
    }
    char *body = strchr(log, '\n');
    if (body == NULL) {
        free(log);
        return;
    }
    *body++ = '\0';
    const char *dest = log + strlen(MAGIC);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.%d.tmp", dest, (int)getpid()) >= (int)sizeof tmp) {
        free(log);
        return;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *out = fd < 0 ? NULL : fdopen(fd, "w");
    if (out == NULL) {
        if (fd >= 0)
            close(fd);
        free(log);
        return;
    }
    fchmod(fd, 0600);
    struct merge m = {.out = out, .first = 1};
    fputs("{\"traceEvents\":[\n", out);
    for (char *line = strtok(body, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] != '{')
            continue;
        emit(&m, line, strlen(line));
        note_call(&m, line);
    }
    char vm_name[] = "vm-trace.json";
    char *vm = slurp(dir, vm_name);
    char own[512];
    int n = call_event(own, sizeof own, "delete", begin_ns, oci_timeline_now(), 0);
    emit(&m, own, (size_t)n);
    note_call(&m, own);
    emit_vm(&m, vm);
    emit_gaps_and_names(&m);
    fputs("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"CLOCK_MONOTONIC\","
          "\"unit\":\"us\"}}\n",
          out);
    int failed = ferror(out);
    failed |= fclose(out) != 0;
    if (failed || rename(tmp, dest) != 0)
        unlink(tmp);
    free(vm);
    free(log);
}
