/* The installed `gpuq` command: gpuq/cli/fast/stub.py's fast path in C, so that a call does
 * not pay for starting Python (~10 ms, half of a call's budget: bench/cli_bench.py).
 *
 * It hands argv, environment, umask, groups, ignored signals, the std streams' encodings, fds
 * 0, 1, 2 and the working folder to the user's warm CLI helper (gpuq/cli/fast/protocol.py has
 * the request and the answers), forwards signals to the helper's child that runs the call, and
 * leaves with its exit status. Everything else it leaves to the Python stub installed beside it
 * (gpuq-py, scripts/gpuq), which it exec()s with the same argv: no helper, a dead socket, any
 * failure before the helper said PID, a stale helper (S), a declined call (D: another group, a
 * verb that must own its process), GPUQ_CLI_HELPER=off, a setting it does not mirror.
 *
 * Which helper: the C stub cannot compute the helper's key (protocol.installation_key: the
 * interpreter's prefix and version, the package's path), so the Python stub links it. This
 * program hashes (FNV-1a 64) its own path and what a Python start-up reads that could change
 * that key (PYTHON* variables, HOME, the locale variables) with its guess of Python's UTF-8
 * mode, and connects to stub-HASH.sock in the helper's folder: a link that the Python stub,
 * exec()ed by this one, makes to its cli-KEY.sock (protocol.link_stub) when the guess matched
 * its own UTF-8 mode. So a wrong guess only costs the slow path, never a wrong helper.
 *
 * Safety, as stub.py: the folder must be a real directory, ours, mode 0700 (checked on an
 * O_PATH fd that the connection then goes through, so it cannot be swapped in between), and the
 * link must name a cli-KEY.sock in that folder; the helper checks the peer's uid itself.
 *
 * The encodings are what a fresh Python would give sys.stdin/stdout/stderr (CPython's
 * preconfig: UTF-8 mode, C locale coercion, PYTHONIOENCODING, the locale's codeset and the
 * surrogateescape/strict/backslashreplace rules); the spare turns the codeset into Python's
 * codec name (codecs.lookup) and declines an unknown one. The environment is sent as the Python
 * stub's os.environb has it: the first of duplicate names, LC_CTYPE coerced, and what `import
 * gpuq` sets (PACKAGE_DEFAULTS). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* kept equal to gpuq/cli/fast/protocol.py and stub.py (tests/unit/test_cli_c_stub.py) */
#define MAGIC "GPUQCLI1"
#define HELPER_VAR "GPUQ_CLI_HELPER"
#define STUB_VAR "GPUQ_CLI_STUB"
#define PYTHON_STUB "gpuq-py"
static const int FORWARDED[] = {1, 2, 3, 10, 12, 15, 18, 28};
#define SIGTSTP_NUMBER 20
static const char *const OFF_VALUES[] = {"off", "0", "no", "false"};
/* CPython's C locale coercion targets (Python/pylifecycle.c), in its order */
static const char *const COERCION_TARGETS[] = {"C.UTF-8", "C.utf8", "UTF-8"};
/* what `import gpuq` sets where unset (gpuq/__init__.py), in every gpuq process: the Python
 * stub sends it so */
static const char *const PACKAGE_DEFAULTS[] = {"GRPC_ENABLE_FORK_SUPPORT=false"};
/* what a Python start-up reads that the helper's key depends on, beyond PYTHON* */
static const char *const KEY_VARS[] = {"HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOCPATH"};
#ifndef GPUQ_UTF8_DEFAULT
#define GPUQ_UTF8_DEFAULT 0 /* setup.py: 1 for a Python whose UTF-8 mode is on by default */
#endif

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

static char self_dir[PATH_MAX];
static char stub_value[2 * PATH_MAX];
static volatile pid_t child;

/* ---- the slow path: the Python stub beside this program --------------------------------- */

static void python_stub(char **argv) __attribute__((noreturn));
static void python_stub(char **argv) {
    char path[PATH_MAX + sizeof(PYTHON_STUB) + 1];
    snprintf(path, sizeof(path), "%s/%s", self_dir, PYTHON_STUB);
    if (stub_value[0] != '\0') setenv(STUB_VAR, stub_value, 1);
    execv(path, argv);
    dprintf(2, "gpuq: cannot run %s: %s\n", path, strerror(errno));
    _exit(127);
}

/* ---- small things ------------------------------------------------------------------------ */

struct buffer {
    char *data;
    size_t size, capacity;
};

static int append(struct buffer *b, const void *bytes, size_t n) {
    if (b->size + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->size + n) capacity *= 2;
        char *data = realloc(b->data, capacity);
        if (data == NULL) return -1;
        b->data = data;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, bytes, n);
    b->size += n;
    return 0;
}

/* one NUL-separated field (the NUL before it unless it is the first) */
static int field(struct buffer *b, const char *text, size_t n) {
    if (b->size > 4 && append(b, "", 1) < 0) return -1;
    return append(b, text, n);
}

static int field_text(struct buffer *b, const char *text) { return field(b, text, strlen(text)); }

static uint64_t fnv1a(uint64_t value, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        value ^= (unsigned char)bytes[i];
        value *= 0x100000001b3ULL;
    }
    return value;
}

/* getenv as Python reads its settings (_Py_GetEnv): an empty value is no value */
static const char *python_env(const char *name) {
    const char *value = getenv(name);
    return value != NULL && value[0] != '\0' ? value : NULL;
}

static size_t name_length(const char *entry) {
    const char *equals = strchr(entry, '=');
    return equals ? (size_t)(equals - entry) : strlen(entry);
}

static int compare_entries(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* whether environ[i] is the first entry of its name (Python's os.environ keeps the first) */
static int first_of_its_name(size_t i) {
    size_t n = name_length(environ[i]);
    for (size_t j = 0; j < i; j++)
        if (name_length(environ[j]) == n && memcmp(environ[j], environ[i], n) == 0) return 0;
    return 1;
}

static int is_private(const struct stat *st) {
    return S_ISDIR(st->st_mode) && st->st_uid == getuid() && (st->st_mode & 07777) == 0700;
}

/* ---- what Python would make of this environment ------------------------------------------ */

struct python_view {
    int utf8_mode;
    const char *coerced; /* the LC_CTYPE that C locale coercion sets, or NULL */
    char encoding[128];
    char errors[128];
};

/* CPython's preconfig and stdio configuration (Python/preconfig.c, initconfig.c,
 * pylifecycle.c): 0, or -1 where this program does not mirror Python (then the slow path). */
static int python_view(struct python_view *view) {
    const char *ctype = setlocale(LC_CTYPE, "");
    ctype = setlocale(LC_CTYPE, NULL);
    int legacy = ctype != NULL && (strcmp(ctype, "C") == 0 || strcmp(ctype, "POSIX") == 0);
    const char *utf8 = python_env("PYTHONUTF8");
    if (utf8 == NULL)
        view->utf8_mode = legacy ? 1 : GPUQ_UTF8_DEFAULT;
    else if (strcmp(utf8, "1") == 0 || strcmp(utf8, "0") == 0)
        view->utf8_mode = utf8[0] == '1';
    else
        return -1; /* Python refuses to start: let it say so */
    const char *coerce = python_env("PYTHONCOERCECLOCALE");
    if (coerce != NULL && strcmp(coerce, "warn") == 0) return -1; /* it warns on stderr */
    view->coerced = NULL;
    if ((coerce == NULL || strcmp(coerce, "0") != 0) && python_env("LC_ALL") == NULL &&
        ctype != NULL && strcmp(ctype, "C") == 0) {
        for (size_t i = 0; i < COUNT(COERCION_TARGETS); i++) {
            if (setlocale(LC_CTYPE, COERCION_TARGETS[i]) != NULL) {
                const char *codeset = nl_langinfo(CODESET);
                if (codeset != NULL && codeset[0] != '\0') {
                    view->coerced = COERCION_TARGETS[i];
                    break;
                }
            }
            setlocale(LC_CTYPE, "");
        }
    }
    /* the std streams: PYTHONIOENCODING, else UTF-8 mode's or the locale's */
    const char *encoding = NULL, *errors = NULL;
    char io[256] = "";
    const char *setting = python_env("PYTHONIOENCODING");
    if (setting != NULL) {
        if (strlen(setting) >= sizeof(io)) return -1;
        strcpy(io, setting);
        char *colon = strchr(io, ':');
        if (colon != NULL) {
            *colon = '\0';
            if (colon[1] != '\0') errors = colon + 1;
        }
        if (io[0] != '\0') {
            encoding = io;
            if (errors == NULL) errors = "strict";
        }
    }
    if (encoding == NULL) {
        const char *codeset = view->utf8_mode ? "utf-8" : nl_langinfo(CODESET);
        encoding = codeset != NULL && codeset[0] != '\0' ? codeset : "utf-8";
    }
    if (errors == NULL) {
        const char *now = setlocale(LC_CTYPE, NULL);
        int escape = view->utf8_mode;
        if (now != NULL) {
            escape |= strcmp(now, "C") == 0 || strcmp(now, "POSIX") == 0;
            for (size_t i = 0; i < COUNT(COERCION_TARGETS); i++)
                escape |= strcmp(now, COERCION_TARGETS[i]) == 0;
        }
        errors = escape ? "surrogateescape" : "strict";
    }
    if (strlen(encoding) >= sizeof(view->encoding) || strlen(errors) >= sizeof(view->errors))
        return -1;
    strcpy(view->encoding, encoding);
    strcpy(view->errors, errors);
    return 0;
}

/* the name of the link to the helper: this program, its guess of UTF-8 mode, and the
 * variables that Python's start-up reads and the helper's key depends on */
static uint64_t stub_hash(const char *self, int utf8_mode) {
    uint64_t value = 0xcbf29ce484222325ULL;
    char mode[2] = {(char)('0' + utf8_mode), '\0'};
    value = fnv1a(value, self, strlen(self) + 1);
    value = fnv1a(value, mode, 2);
    for (size_t i = 0; i < COUNT(KEY_VARS); i++) {
        const char *found = getenv(KEY_VARS[i]);
        if (found == NULL) continue;
        value = fnv1a(value, KEY_VARS[i], strlen(KEY_VARS[i]));
        value = fnv1a(value, "=", 1);
        value = fnv1a(value, found, strlen(found) + 1);
    }
    size_t count = 0;
    for (size_t i = 0; environ[i] != NULL; i++) count++;
    char **python = calloc(count + 1, sizeof(char *));
    size_t n = 0;
    for (size_t i = 0; python != NULL && environ[i] != NULL; i++)
        if (strncmp(environ[i], "PYTHON", 6) == 0 && first_of_its_name(i))
            python[n++] = environ[i];
    if (python != NULL) qsort(python, n, sizeof(char *), compare_entries);
    for (size_t i = 0; i < n; i++) value = fnv1a(value, python[i], strlen(python[i]) + 1);
    free(python);
    return value;
}

/* ---- the helper's socket ----------------------------------------------------------------- */

/* protocol.socket_path's folder, opened (O_PATH) when it is a real directory, ours, 0700 */
static int helper_folder(void) {
    char folder[PATH_MAX];
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    snprintf(folder, sizeof(folder), "/tmp/gpuq-cli-%u", (unsigned)getuid());
    if (runtime != NULL && runtime[0] == '/' && lstat(runtime, &st) == 0 && is_private(&st)) {
        size_t n = strlen(runtime);
        while (n > 0 && runtime[n - 1] == '/') n--;
        if (n + sizeof("/gpuq") > sizeof(folder)) return -1;
        snprintf(folder, sizeof(folder), "%.*s/gpuq", (int)n, runtime);
    }
    int fd = open(folder, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, &st) < 0 || !is_private(&st)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* a connection to the helper the Python stub linked for this hash, or -1 */
static int connect_helper(uint64_t hash) {
    int folder = helper_folder();
    if (folder < 0) return -1;
    char link[64], target[64];
    snprintf(link, sizeof(link), "stub-%016llx.sock", (unsigned long long)hash);
    ssize_t n = readlinkat(folder, link, target, sizeof(target) - 1);
    int sock = -1;
    if (n == 25) { /* cli-KEY.sock: KEY is 16 hex digits, and the socket is in this folder */
        target[n] = '\0';
        int valid = strncmp(target, "cli-", 4) == 0 && strcmp(target + 20, ".sock") == 0;
        for (int i = 4; i < 20; i++) valid &= strchr("0123456789abcdef", target[i]) != NULL;
        struct sockaddr_un address = {.sun_family = AF_UNIX};
        snprintf(address.sun_path, sizeof(address.sun_path), "/proc/self/fd/%d/%s", folder,
                 target);
        if (valid) sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sock >= 0 && connect(sock, (struct sockaddr *)&address, sizeof(address)) < 0) {
            close(sock);
            sock = -1;
        }
    }
    close(folder);
    return sock;
}

/* ---- the request (protocol.send_request) ------------------------------------------------- */

static int ignored_signals(void) {
    int ignored = 0;
    struct sigaction action;
    for (size_t i = 0; i <= COUNT(FORWARDED); i++) {
        int number = i < COUNT(FORWARDED) ? FORWARDED[i] : SIGTSTP_NUMBER;
        if (sigaction(number, NULL, &action) == 0 && action.sa_handler == SIG_IGN)
            ignored |= 1 << number;
    }
    return ignored;
}

static int environment(struct buffer *b, const char *coerced) {
    int seen_ctype = 0;
    for (size_t i = 0; environ[i] != NULL; i++) {
        const char *entry = environ[i];
        if (strchr(entry, '=') == NULL || !first_of_its_name(i)) continue;
        if (coerced != NULL && strncmp(entry, "LC_CTYPE=", 9) == 0) {
            seen_ctype = 1;
            if (field_text(b, "LC_CTYPE=") < 0 || append(b, coerced, strlen(coerced)) < 0)
                return -1;
        } else if (field_text(b, entry) < 0) {
            return -1;
        }
    }
    if (coerced != NULL && !seen_ctype)
        if (field_text(b, "LC_CTYPE=") < 0 || append(b, coerced, strlen(coerced)) < 0) return -1;
    for (size_t i = 0; i < COUNT(PACKAGE_DEFAULTS); i++) {
        size_t n = name_length(PACKAGE_DEFAULTS[i]);
        int found = 0;
        for (size_t j = 0; environ[j] != NULL && !found; j++)
            found = strncmp(environ[j], PACKAGE_DEFAULTS[i], n + 1) == 0;
        if (!found && field_text(b, PACKAGE_DEFAULTS[i]) < 0) return -1;
    }
    return 0;
}

static int request(struct buffer *b, int argc, char **argv, const char *argv0,
                   const struct python_view *view, int ignored) {
    char number[32];
    if (append(b, "\0\0\0\0", 4) < 0 || field_text(b, MAGIC) < 0) return -1;
    mode_t mask = umask(022);
    umask(mask);
    snprintf(number, sizeof(number), "%d", (int)mask);
    if (field_text(b, number) < 0) return -1;
    snprintf(number, sizeof(number), "%d", ignored);
    if (field_text(b, number) < 0) return -1;
    int count = getgroups(0, NULL);
    gid_t *groups = calloc(count > 0 ? (size_t)count : 1, sizeof(gid_t));
    if (groups == NULL || (count = getgroups(count, groups)) < 0 || field(b, "", 0) < 0) {
        free(groups);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        snprintf(number, sizeof(number), i ? ",%u" : "%u", (unsigned)groups[i]);
        if (append(b, number, strlen(number)) < 0) return -1;
    }
    free(groups);
    for (int fd = 0; fd < 3; fd++) {
        const char *errors = fd == 2 ? "backslashreplace" : view->errors;
        if (field_text(b, view->encoding) < 0 || append(b, ":", 1) < 0 ||
            append(b, errors, strlen(errors)) < 0)
            return -1;
    }
    snprintf(number, sizeof(number), "%d", argc > 0 ? argc : 1);
    if (field_text(b, number) < 0 || field_text(b, argv0) < 0) return -1;
    for (int i = 1; i < argc; i++)
        if (field_text(b, argv[i]) < 0) return -1;
    if (environment(b, view->coerced) < 0) return -1;
    uint32_t size = (uint32_t)(b->size - 4);
    unsigned char *length = (unsigned char *)b->data;
    length[0] = size >> 24, length[1] = size >> 16, length[2] = size >> 8, length[3] = size;
    return 0;
}

/* the request with fds 0, 1, 2 and the working folder (SCM_RIGHTS) */
static int send_request(int sock, const struct buffer *b) {
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwd < 0) return -1;
    int fds[4] = {0, 1, 2, cwd};
    union {
        char space[CMSG_SPACE(sizeof(fds))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof(control));
    struct iovec iov = {.iov_base = b->data, .iov_len = b->size};
    struct msghdr message = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control.space,
                             .msg_controllen = sizeof(control.space)};
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(header), fds, sizeof(fds));
    ssize_t sent;
    do sent = sendmsg(sock, &message, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    close(cwd);
    size_t done = sent < 0 ? 0 : (size_t)sent;
    while (sent >= 0 && done < b->size) {
        sent = send(sock, b->data + done, b->size - done, MSG_NOSIGNAL);
        if (sent > 0) done += (size_t)sent;
        if (sent < 0 && errno == EINTR) sent = 0;
    }
    return sent < 0 ? -1 : 0;
}

/* the next answer (protocol.answer): 0, or -1 when the connection closed or failed */
static int read_answer(int sock, char *kind, int32_t *value) {
    unsigned char data[5];
    size_t got = 0;
    while (got < sizeof(data)) {
        ssize_t n = read(sock, data + got, sizeof(data) - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    *kind = (char)data[0];
    *value = (int32_t)((uint32_t)data[1] << 24 | (uint32_t)data[2] << 16 |
                       (uint32_t)data[3] << 8 | (uint32_t)data[4]);
    return 0;
}

/* ---- after PID: signals go to the child (stub.py's _forward_signals) ---------------------- */

static void forward(int number) {
    int saved = errno;
    kill(child, number);
    errno = saved;
}

static void suspend(int number);

static void handle(int number, void (*handler)(int), int flags) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = handler;
    action.sa_flags = SA_RESTART | flags;
    sigemptyset(&action.sa_mask);
    sigaction(number, &action, NULL);
}

/* Ctrl-Z: stop the child (its process group ignores SIGTSTP: no terminal), then this
 * process; SIGCONT (forwarded) resumes both */
static void suspend(int number) {
    int saved = errno;
    kill(child, SIGSTOP);
    handle(number, SIG_DFL, 0);
    kill(getpid(), number); /* SA_NODEFER: delivered now, and stops here */
    handle(number, suspend, SA_NODEFER);
    errno = saved;
}

static void forward_signals(int ignored) {
    for (size_t i = 0; i < COUNT(FORWARDED); i++)
        if (!(ignored & (1 << FORWARDED[i]))) handle(FORWARDED[i], forward, 0);
    if (!(ignored & (1 << SIGTSTP_NUMBER))) handle(SIGTSTP_NUMBER, suspend, SA_NODEFER);
}

/* the helper went away while the child ran: wait for the child, whose status is lost */
static int orphaned(pid_t pid) {
    struct timespec pause = {0, 50 * 1000 * 1000};
    while (kill(pid, 0) == 0) nanosleep(&pause, NULL);
    static const char said[] =
        "gpuq: error: the CLI helper ended before the command; its status is unknown\n";
    if (write(2, said, sizeof(said) - 1) < 0) return 1;
    return 1;
}

/* ---- main --------------------------------------------------------------------------------- */

static void find_self(char *self, size_t size, const char *argv0) {
    ssize_t n = readlink("/proc/self/exe", self, size - 1);
    if (n > 0) {
        self[n] = '\0';
    } else if (realpath(argv0, self) == NULL) {
        dprintf(2, "gpuq: cannot find where this program is: %s\n", strerror(errno));
        _exit(127);
    }
    strcpy(self_dir, self);
    char *slash = strrchr(self_dir, '/');
    if (slash != NULL) *(slash == self_dir ? slash + 1 : slash) = '\0';
}

/* GPUQ_CLI_HELPER as stub.py reads it: "off" (and the other OFF_VALUES), "debug", or other */
static int helper_mode(int *debug) {
    const char *value = getenv(HELPER_VAR);
    char lower[16] = "";
    if (value != NULL && strlen(value) < sizeof(lower))
        for (size_t i = 0; value[i] != '\0'; i++)
            lower[i] = (char)(value[i] >= 'A' && value[i] <= 'Z' ? value[i] + 32 : value[i]);
    *debug = strcmp(lower, "debug") == 0;
    for (size_t i = 0; i < COUNT(OFF_VALUES); i++)
        if (strcmp(lower, OFF_VALUES[i]) == 0) return 0;
    return 1;
}

int main(int argc, char **argv) {
    char self[PATH_MAX];
    const char *argv0 = (const char *)getauxval(AT_EXECFN);
    if (argv0 == NULL) argv0 = argc > 0 ? argv[0] : "gpuq";
    find_self(self, sizeof(self), argv0);
    snprintf(stub_value, sizeof(stub_value), "::%s", argv0); /* argv[0] alone: no link */
    for (int fd = 0; fd < 3; fd++)  /* Python's std stream would be None: its slow path */
        if (fcntl(fd, F_GETFD) < 0) python_stub(argv);
    int debug = 0;
    if (!helper_mode(&debug)) python_stub(argv);
    struct python_view view;
    if (python_view(&view) < 0) python_stub(argv);
    uint64_t hash = stub_hash(self, view.utf8_mode);
    snprintf(stub_value, sizeof(stub_value), "%016llx:%d:%s", (unsigned long long)hash,
             view.utf8_mode, argv0);
    int sock = connect_helper(hash);
    if (sock < 0) python_stub(argv);
    struct buffer body = {0};
    int ignored = ignored_signals();
    char kind = 0;
    int32_t value = 0;
    if (request(&body, argc, argv, argv0, &view, ignored) < 0 || send_request(sock, &body) < 0 ||
        read_answer(sock, &kind, &value) < 0 || kind != 'P') {
        close(sock);
        python_stub(argv); /* none answered, stale (S), declined (D): the Python stub */
    }
    free(body.data);
    child = value;
    if (debug) dprintf(2, "gpuq: cli helper: child %d\n", (int)child);
    forward_signals(ignored);
    if (read_answer(sock, &kind, &value) < 0 || kind != 'X') _exit(orphaned(child));
    int status = value;
    _exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
}
