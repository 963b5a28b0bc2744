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
 * At EOF (the agent is gone) serve() returns; supervisors are in their own sessions and go on.
 *
 * A spare: once the server has had no request for SPARE_AFTER_MS, it forks the next supervisor
 * ahead of its job, and that process waits on a socket of its own for a job folder. A request
 * then hands the spare its folder instead of forking: the fork, and the new process's wait for a
 * CPU (on a busy 2-core machine, 0.7 ms before its first system call), are off the launch's
 * path. Requests that come faster than that (a drain) fork as before, so a spare costs no more
 * processes than jobs. A spare that finds its socket closed (the server is gone) exits 0. */
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
#include <sys/prctl.h>
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

/* the spare waiting for a job folder: its pid and our end of its socket; 0 and -1 when none.
 * A spare that dies unused is no job's supervisor: the agent is not told. */
static volatile sig_atomic_t spare_pid;
/* the last spare dropped because its socket closed: it may be reaped only after that */
static volatile sig_atomic_t lost_spare;
static int spare_sock = -1;
static int spare_failed; /* socketpair or fork failed: none until the next request */

static void reap_supervisors(int signum) {
    (void)signum;
    int saved = errno, status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (status == 0 || pid == spare_pid || pid == lost_spare || exits_head - exits_tail >= EXITS_MAX) continue;
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

#define SPARE_AFTER_MS 20 /* quiet time before a spare is forked (see the top) */
#define SPARE_FD 3           /* where a spare holds its socket */
#define MAX_JOB_DIR 4096


/* In a spare: the job folder, read from SPARE_FD up to its newline; NULL at EOF (no job will
 * come: the server is gone) or on a malformed one. */
static char *await_job_dir(void) {
    static char dir[MAX_JOB_DIR + 1];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(SPARE_FD, dir + len, sizeof dir - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        len += (size_t)n;
        char *end = memchr(dir, '\n', len);
        if (end != NULL) {
            *end = '\0';
            return dir[0] == '/' ? dir : NULL;
        }
        if (len == sizeof dir - 1) return NULL;
    }
}

/* Fork a supervisor. With a job folder, it supervises that job now; without (a spare), it
 * waits on `spare_end` for one. Either way it keeps none of the server's descriptors. */
static pid_t fork_supervisor(int control, const char *job_dir, int spare_end, double ack_wait) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    signal(SIGCHLD, SIG_DFL); /* the supervisor installs its own */
    close(control);
    if (spare_end >= 0 && spare_end != SPARE_FD) {
        dup2(spare_end, SPARE_FD); /* the copy is not close-on-exec: closed before the job */
        close(spare_end);
    }
    close_from(spare_end >= 0 ? SPARE_FD + 1 : 3);
    setsid();
    if (spare_end >= 0) {
        prctl(PR_SET_NAME, "gpuq spare", 0, 0, 0); /* in ps and top until it has a job */
        job_dir = await_job_dir();
        close(SPARE_FD);
        if (job_dir == NULL) _exit(0);
    }
    _exit(supervise(job_dir, ack_wait));
}

static void drop_spare(void) {
    if (spare_sock >= 0) close(spare_sock); /* a spare that still waits sees EOF and exits */
    spare_sock = -1;
    spare_pid = 0;
}

static void make_spare(int control, double ack_wait) {
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
        spare_failed = 1;
        return;
    }
    pid_t pid = fork_supervisor(control, NULL, ends[1], ack_wait);
    close(ends[1]);
    if (pid < 0) {
        close(ends[0]);
        spare_failed = 1;
        return;
    }
    spare_pid = pid;
    spare_sock = ends[0];
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

/* The spare's pid once it has `job_dir`, or 0 when there is no spare or it could not take the
 * folder (it died: the socket is closed), and the caller forks as before. */
static pid_t hand_to_spare(const char *job_dir) {
    if (spare_sock < 0 || strchr(job_dir, '\n') != NULL) return 0; /* a line is one folder */
    size_t len = strlen(job_dir);
    pid_t pid = spare_pid;
    spare_pid = 0; /* from here on a job's supervisor: its end is the agent's to know */
    buf line = {0};
    buf_add(&line, job_dir, len);
    buf_add(&line, "\n", 1);
    int sent = send_all(spare_sock, &line) == 0; /* a path fits the socket's buffer: no wait */
    free(line.data);
    drop_spare();
    return sent ? pid : 0;
}

static void answer(int control, const char *line, size_t len, double ack_wait, buf *replies) {
    jval *request = json_parse(line, len);
    const char *job_dir;
    if (!json_cstr(request, "spawn", &job_dir) || job_dir[0] != '/' ||
        strlen(job_dir) > MAX_JOB_DIR) {
        buf_addf(replies, "{\"job_dir\":null,\"error\":\"malformed request\"}\n");
        json_free(request);
        return;
    }
    spare_failed = 0;
    pid_t pid = hand_to_spare(job_dir);
    if (pid == 0) pid = fork_supervisor(control, job_dir, -1, ack_wait);
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
        /* the spare's socket turns readable only when the spare is gone (it never writes) */
        struct pollfd fds[3] = {{control, POLLIN, 0}, {wake[0], POLLIN, 0}, {spare_sock, POLLIN, 0}};
        int quiet = spare_sock < 0 && !spare_failed ? SPARE_AFTER_MS : -1;
        int ready = poll(fds, 3, quiet);
        if (ready < 0 && errno != EINTR) break;
        if (ready == 0) {
            make_spare(control, ack_wait);
            continue;
        }
        if (fds[2].revents) {
            lost_spare = spare_pid;
            drop_spare();
        }
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
    drop_spare();
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
