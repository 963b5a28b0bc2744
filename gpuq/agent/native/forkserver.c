/* gpuq.agent._supervise: the fork server's loop and the supervisors it forks, as a Python
 * extension module so that it installs like any other (no separate executable to place).
 *
 * The fork server process (gpuq/agent/jobs/fork_server.py) calls serve(): from then on it runs
 * this C loop and never Python again, and each supervisor is a fork of it that runs supervise() and
 * _exit()s. A fork of a process that runs no Python touches few pages, so it stays cheap.
 *
 * Protocol on the control socket (JSON lines): the agent sends {"spawn": job_dir}, the server
 * answers {"job_dir": job_dir, "pid": N} or {"job_dir": job_dir, "error": text}, in order.
 * A supervisor that ends other than with exit code 0 (killed by a signal, say) is told, at any
 * time between replies: {"exited": pid, "status": N} (N as waitpid gives it), so that the agent
 * can say how a job's supervisor died.
 * At EOF (the agent is gone) serve() returns; supervisors are in their own sessions and go on. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervise.h"

/* abnormal supervisor exits, from the SIGCHLD handler (the only writer of exits_head) to the
 * loop (the only writer of exits_tail); when full, further ones go untold */
#define EXITS_MAX 1024
static pid_t exit_pids[EXITS_MAX];
static int exit_statuses[EXITS_MAX];
static volatile sig_atomic_t exits_head;
static volatile sig_atomic_t exits_tail;
static int exits_wake = -1;

static void reap_supervisors(int signum) {
    (void)signum;
    int saved = errno, status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (status == 0 || exits_head - exits_tail >= EXITS_MAX) continue;
        exit_pids[exits_head % EXITS_MAX] = pid;
        exit_statuses[exits_head % EXITS_MAX] = status;
        exits_head = exits_head + 1;
    }
    if (exits_wake >= 0) (void)!write(exits_wake, "", 1);
    errno = saved;
}

static void tell_exits(buf *out) {
    while (exits_tail != exits_head) {
        int i = exits_tail % EXITS_MAX;
        buf_addf(out, "{\"exited\":%d,\"status\":%d}\n", exit_pids[i], exit_statuses[i]);
        exits_tail = exits_tail + 1;
    }
}

static void close_from(int lowest) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)lowest, ~0U, 0) == 0) return;
#endif
    long most = sysconf(_SC_OPEN_MAX);
    for (long fd = lowest; fd < (most > 0 ? most : 65536); fd++) close((int)fd);
}

static void answer(int control, const char *line, size_t len, double ack_wait, buf *replies) {
    jval *request = json_parse(line, len);
    const char *job_dir;
    if (!json_cstr(request, "spawn", &job_dir) || job_dir[0] != '/') {
        buf_addf(replies, "{\"job_dir\":null,\"error\":\"malformed request\"}\n");
        json_free(request);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGCHLD, SIG_DFL); /* the supervisor installs its own */
        close(control);
        close_from(3);
        setsid();
        _exit(supervise(job_dir, ack_wait));
    }
    buf_addf(replies, "{\"job_dir\":");
    buf_str(replies, job_dir);
    if (pid < 0) {
        buf_addf(replies, ",\"error\":");
        char text[256];
        snprintf(text, sizeof text, "fork failed: %s", strerror(errno));
        buf_str(replies, text);
        buf_addf(replies, "}\n");
    } else {
        buf_addf(replies, ",\"pid\":%d}\n", pid);
    }
    json_free(request);
}

static int send_all(int fd, const buf *data) {
    size_t sent = 0;
    while (sent < data->len) {
        ssize_t n = send(fd, data->data + sent, data->len - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        sent += (size_t)n;
    }
    return 0;
}

/* Look a user and their groups up once, so that the name service's modules (libnss_systemd and
 * what it links, say) are loaded here and every supervisor, a fork of this process, inherits
 * them instead of loading them for each job (0.49 -> 0.18 ms a job's lookups here). Modules that
 * keep a connection open check, after a fork, that it is still theirs (sssd's does). */
static void warm_user_lookups(void) {
    struct passwd *entry = getpwuid(geteuid());
    if (entry != NULL) {
        gid_t groups[64];
        int n = 64;
        (void)getgrouplist(entry->pw_name, entry->pw_gid, groups, &n);
    }
    endpwent();
    endgrent();
}

static PyObject *serve(PyObject *module, PyObject *args) {
    (void)module;
    int control;
    double ack_wait;
    if (!PyArg_ParseTuple(args, "id", &control, &ack_wait)) return NULL;
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) wake[0] = wake[1] = -1;
    exits_wake = wake[1];
    struct sigaction reap = {.sa_handler = reap_supervisors, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &reap, NULL);
    signal(SIGINT, SIG_IGN); /* a Ctrl-C meant for `gpuq serve` is not for supervisors */
    if (geteuid() == 0) cgroup_detect(); /* once: every supervisor inherits the answer */
    warm_user_lookups();
    buf pending = {0}, replies = {0};
    char chunk[65536];
    for (;;) {
        struct pollfd fds[2] = {{control, POLLIN, 0}, {wake[0], POLLIN, 0}};
        if (poll(fds, wake[0] >= 0 ? 2 : 1, -1) < 0 && errno != EINTR) break;
        replies.len = 0;
        if (wake[0] >= 0 && fds[1].revents) {
            while (read(wake[0], chunk, sizeof chunk) > 0) {
            }
        }
        tell_exits(&replies);
        if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            if (replies.len && send_all(control, &replies) != 0) break;
            continue;
        }
        ssize_t n = recv(control, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR) n = 0;
        else if (n <= 0) break;
        buf_add(&pending, chunk, (size_t)n);
        char *newline;
        while ((newline = memchr(pending.data, '\n', pending.len)) != NULL) {
            size_t len = (size_t)(newline - pending.data);
            size_t start = 0;
            while (start < len && (pending.data[start] == ' ' || pending.data[start] == '\r')) start++;
            if (start < len) answer(control, pending.data, len, ack_wait, &replies);
            buf_consume(&pending, len + 1);
        }
        if (replies.len && send_all(control, &replies) != 0) break;
    }
    exits_wake = -1;
    if (wake[0] >= 0) {
        close(wake[0]);
        close(wake[1]);
    }
    free(pending.data);
    free(replies.data);
    Py_RETURN_NONE;
}

static PyObject *probe_device_program(PyObject *self, PyObject *args) {
    char why[600] = "";
    (void)self;
    (void)args;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = device_program_probe(why, sizeof why);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(failed ? why : "");
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS, "serve(fd, ack_wait): answer spawn requests on fd until EOF."},
    {"probe_device_program", probe_device_program, METH_NOARGS,
     "probe_device_program(): load and close a trivial cgroup device program (RLIMIT_MEMLOCK "
     "raised around the load); \"\" when it loaded, else why not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "gpuq.agent._supervise",
    "The fork server's loop and the per-job supervisor, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__supervise(void) {
    return PyModule_Create(&module_def);
}
