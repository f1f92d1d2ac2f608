/*
 * Pod sandboxes, in the native front end (included once, by oci_front.c,
 * after oci_warm.h: its JSON reader and read_small()).
 *
 * A pod's pause container is a Linux process, not a unikernel: runc runs
 * it, its state under ROOT/.runc. The rule is pyvmm/oci/runtime.py's
 * (_is_sandbox, _delegated, delegate): a create whose bundle's
 * annotations mark it a sandbox (io.kubernetes.cri.container-type or
 * io.kubernetes.cri-o.ContainerType = "sandbox"), and every command about
 * an id that has ROOT/.runc/ID, exec runc (PYVMM_OCI_RUNC, else "runc" on
 * PATH) with --root ROOT/.runc, the other global options and the command
 * as they came. Handing it over here saves the interpreter's start on
 * each of the pod's calls. Where this reader is not sure (a config.json
 * it cannot read whole, too deep or too large), the Python runtime
 * decides; tests/unit/test_oci_sandbox_rule.py checks both agree.
 */

#define RUNC_DIR ".runc"

static const char *const sandbox_keys[] = {"io.kubernetes.cri.container-type",
                                           "io.kubernetes.cri-o.ContainerType"};

/* 1 if the whole text is one JSON value (whitespace around it). */
static int json_whole(const char *text, const char *end)
{
    const char *p = json_skip(text, end, 0);
    return p != NULL && json_ws(p, end) == end;
}

/* A string member's text, its last occurrence's (as Python's json reads a
 * repeated key); 1 if that one is a string. */
static int json_last_str(const char *obj, const char *end, const char *key, char *out, size_t cap)
{
    int found = 0;
    const char *p = json_ws(obj, end);
    if (p >= end || *p != '{')
        return 0;
    p = json_ws(p + 1, end);
    char name[256];
    while (p < end && *p == '"') {
        if ((p = json_str(p, end, name, sizeof name)) == NULL)
            return 0;
        p = json_ws(p, end);
        if (p >= end || *p++ != ':')
            return 0;
        p = json_ws(p, end);
        if (strcmp(name, key) == 0)
            found = json_str(p, end, out, cap) != NULL;
        if ((p = json_skip(p, end, 1)) == NULL)
            return 0;
        p = json_ws(p, end);
        if (p < end && *p == ',')
            p = json_ws(p + 1, end);
    }
    return found;
}

/* 1: a pod sandbox; 0: not one, or not sure (the Python runtime decides). */
static int sandbox_bundle(const char *bundle_abs)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", bundle_abs);
    size_t len;
    char *config = read_small(path, CONFIG_MAX, &len);
    if (config == NULL)
        return 0;
    const char *end = config + len;
    int sandbox = 0;
    if (json_whole(config, end) && *json_ws(config, end) == '{') {
        /* the last "annotations" member, as Python's reader keeps */
        const char *notes = NULL, *p = json_ws(config, end) + 1;
        char name[256];
        for (p = json_ws(p, end); p < end && *p == '"';) {
            p = json_ws(json_str(p, end, name, sizeof name), end) + 1; /* whole: well formed */
            p = json_ws(p, end);
            if (strcmp(name, "annotations") == 0)
                notes = p;
            p = json_ws(json_skip(p, end, 1), end);
            if (p < end && *p == ',')
                p = json_ws(p + 1, end);
        }
        char value[16];
        for (size_t i = 0; notes != NULL && i < sizeof sandbox_keys / sizeof sandbox_keys[0]; i++)
            sandbox |= json_last_str(notes, end, sandbox_keys[i], value, sizeof value) &&
                       !strcmp(value, "sandbox");
    }
    free(config);
    return sandbox;
}

/* 1 if runc keeps the container `id` (a valid one): ROOT/.runc/ID. */
static int runc_owns(const char *id)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/" RUNC_DIR "/%s", g_root, id);
    return is_dir(path);
}

/* runc's path (PYVMM_OCI_RUNC or "runc", on PATH unless it has a slash),
 * into out; 0 if there is none. */
static int find_runc(char *out, size_t cap)
{
    const char *name = getenv("PYVMM_OCI_RUNC");
    if (name == NULL || name[0] == '\0')
        name = "runc";
    struct stat st;
    if (strchr(name, '/') != NULL)
        return snprintf(out, cap, "%s", name) < (int)cap && access(name, X_OK) == 0 &&
               stat(name, &st) == 0 && !S_ISDIR(st.st_mode);
    const char *dirs = getenv("PATH");
    if (dirs == NULL)
        dirs = "/bin:/usr/bin";
    for (const char *p = dirs;; p++) {
        size_t n = strcspn(p, ":");
        if (snprintf(out, cap, "%.*s/%s", (int)n, n ? p : ".", name) < (int)cap &&
            access(out, X_OK) == 0 && stat(out, &st) == 0 && !S_ISDIR(st.st_mode))
            return 1;
        p += n;
        if (*p == '\0')
            return 0;
    }
}

/* The call, with runc: argv[command] on as it came, the global options
 * before it but --root, which becomes ROOT/.runc. */
static void runc(int command)
{
    trace();
    char path[PATH_MAX];
    if (!find_runc(path, sizeof path))
        exit(refuse("a pod sandbox container needs runc, which is not installed"));
    if (mkdir(g_root, 0700) != 0 && errno != EEXIST)
        python(); /* (its parents too, or why not: the Python runtime's word) */
    char root[PATH_MAX + 16];
    snprintf(root, sizeof root, "%s/" RUNC_DIR, g_root);
    char **args = calloc((size_t)g_argc + 4, sizeof *args);
    if (args == NULL)
        exit(refuse("out of memory"));
    int n = 0;
    args[n++] = path;
    args[n++] = "--root";
    args[n++] = root;
    for (int i = 1; i < command; i++) {
        if (!strcmp(g_argv[i], "--root")) {
            i++; /* and its value */
            continue;
        }
        if (strncmp(g_argv[i], "--root=", 7) != 0)
            args[n++] = g_argv[i];
    }
    for (int i = command; i < g_argc; i++)
        args[n++] = g_argv[i];
    args[n] = NULL;
    execv(path, args);
    exit(refuse("cannot run %s: %s", path, strerror(errno)));
}
