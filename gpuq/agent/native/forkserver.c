/* gpuq.agent._supervise: the fork server's loop and the supervisors it forks, as a Python
 * extension module so that it installs like any other (no separate executable to place).
 *
 * The fork server process (gpuq/agent/forkserver.py) calls serve(): from then on it runs this C loop
 * and never Python again, and each supervisor is a fork of it that runs supervise() and
 * _exit()s. A fork of a process that runs no Python touches few pages, so it stays cheap.
 *
 * Protocol on the control socket (JSON lines): the hub sends {"spawn": job_dir}, the server
 * answers {"job_dir": job_dir, "pid": N} or {"job_dir": job_dir, "error": text}, in order.
 * At EOF (the agent is gone) serve() returns; supervisors are in their own sessions and go on. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervise.h"

static void reap_supervisors(int signum) {
    (void)signum;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
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

static PyObject *serve(PyObject *module, PyObject *args) {
    (void)module;
    int control;
    double ack_wait;
    if (!PyArg_ParseTuple(args, "id", &control, &ack_wait)) return NULL;
    struct sigaction reap = {.sa_handler = reap_supervisors, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &reap, NULL);
    signal(SIGINT, SIG_IGN); /* a Ctrl-C meant for `gpuq serve` is not for supervisors */
    if (geteuid() == 0) cgroup_detect(); /* once: every supervisor inherits the answer */
    buf pending = {0}, replies = {0};
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(control, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        buf_add(&pending, chunk, (size_t)n);
        replies.len = 0;
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
    free(pending.data);
    free(replies.data);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS, "serve(fd, ack_wait): answer spawn requests on fd until EOF."},
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
