/* The per-job supervisor: the job's parent, forked by the fork server, one per job.
 *
 * It owns everything about one run so that the agent can die and come back without the job
 * noticing: it writes the script, starts the job, enforces the time and memory limits, kills
 * every leftover process when the job ends, writes result.json durably, and tells the agent
 * over a Unix socket, reconnecting while the agent restarts. It is C, not Python,
 * because a forked Python supervisor cost 3 to 4 ms of CPU per job (copy-on-write faults in the
 * interpreter's heap, bytecode), which capped a 2-core node near 150 `true` jobs/s; this costs
 * about the fork and exec of the job itself.
 *
 * Protocol with the agent, newline-delimited JSON on `<state>/agent.sock`
 * (gpuq/agent/jobs/supervisors.py):
 *   supervisor -> agent  {"type":"hello","job_id","pid","job_pid","started_at","isolation",
 *                        "cpu_binding","status":"running"} (or "status":"ended" with "result"),
 *                        {"type":"ended","job_id","result"}; the result has the same two fields
 *   agent -> supervisor  {"type":"stop","end_state","reason","signal","grace"},
 *                        {"type":"signal","signal"}, {"type":"ack"}: the end is recorded;
 *                        delete the folder and exit; {"type":"lease","until","why"}: see Fencing.
 * The folder: spec.json (from the agent), script, supervisor.pid ("<pid> <start time>"),
 * job.pid ("<job pid> <start time> <how it was made>", then each of the job's cgroup folders on
 * a line of its own), isolation (the device isolation the job got, one line), result.json (written with
 * temp + fsync + rename; a reader falls back to result.json.tmp).
 *
 * Who the job runs as: a spec with a uid names the account (`user`); the supervisor looks it up
 * again (it must exist and have that uid), takes its primary group unless a gid is given (which
 * must be one of the user's), and its groups as initgroups(3) does (getgrouplist). The child
 * sets groups, gid and uid before it touches anything the user named: the working folder, the
 * output files (opened as the user: a link the user planted gets the user's rights, never
 * root's), the script. spec.json, results and pid files are root's, 0600; the script is the
 * user's, 0700, in a folder the user may only pass through (0711, made by the agent).
 *
 * Cgroups: the job's groups are <cgroup_parent>/<cgroup_key>/job_<id>, the key being the
 * installation's (gpuq.agent.jobs.launch_spec.cgroup_key), so that two installations never
 * share one. On cgroup v2, "cgroup_delegated" names the delegated subtree that holds them (the
 * agent prepared it: gpuq/agent/jobs/job_cgroups.py): controllers are enabled only inside it.
 * A v2 group also gets memory.oom.group 1 (an OOM ends the whole job) and pids.max
 * ("job_max_pids", 0: none). The job's main process is born in its v2 group (clone3 with
 * CLONE_INTO_CGROUP): moving a process between groups can wait for an RCU grace period, 10 to
 * 16 ms of each start; it joins v1 groups (a hybrid host) by writing its pid, as it joins every
 * group where the kernel refuses clone3 (make_child).
 *
 * Interactive jobs (spec.json has a "terminal"): the job runs on a pseudo-terminal instead of
 * output files. The supervisor opens it (window size and modes from the spec), the job's main
 * process becomes a session leader with the terminal as its controlling terminal and as its
 * fds 0, 1 and 2, and the supervisor keeps the master open for its own life (so that an agent
 * that restarts neither hangs the job up nor loses what it wrote). It serves the master on
 * `<job_dir>/pty.sock` (0600, the supervisor's user): each connection from a process of its
 * own euid (SO_PEERCRED) gets one byte "T" with the master fd (SCM_RIGHTS); any other gets
 * "N" and no fd. The agent (gpuq/agent/jobs/pty_relay.py) relays the terminal from there.
 *
 * Fencing: a job must never run on two nodes at once, and the coordinator gives a silent node's
 * jobs to other nodes. So the supervisor holds a lease (CLOCK_MONOTONIC seconds: spec.json's
 * "lease_until", then each "lease" message's "until") that its agent extends only to what the
 * coordinator has confirmed hearing (gpuq/agent/fencing.py). When the lease runs out (the
 * agent is dead, frozen, or cut off from the coordinator), the supervisor stops the job by
 * itself as a stop would: SIGTERM, the kill grace, SIGKILL and the cgroup; it ends node_fail
 * with a reason that starts "fenced:" (the lease's "why" when the agent gave one), so that a
 * returning agent reports it fenced, not lost. A spec without "lease_until" has no lease.
 *
 * Isolation: the job's GPUs other than its own are denied in its devices group (devices.deny
 * on cgroup v1, a BPF_PROG_TYPE_CGROUP_DEVICE program on v2), its CPUs bound by its cpuset
 * group (else sched_setaffinity). Where the machine allows no device rule the job still runs,
 * and "isolation" says "advisory: <why>": never silently unenforced. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "supervise.h"

#define RECONNECT_DELAY 0.2
#define BACKLOG_DELAY 0.01
#define MEM_POLL_INTERVAL 0.25
#define KILL_RETRY 1.0      /* SIGKILL again this often while the main process has not gone */
#define LEFTOVER_DEADLINE 10.0 /* give up verifying that leftovers are gone after this long */
#define SETTLE 0.1 /* seconds a tree that was just signalled gets to exit before survivors count */
/* --signal SIG@S with S not shorter than the time limit: SIG this long after start (or at the
 * limit if sooner), "as soon as possible" but after the job has had a moment to set its traps;
 * at the very start it would kill a script before its `trap` line runs */
#define WARN_EARLIEST 1.0
/* bounds for numbers from JSON, checked before any cast to an integer (out of range: undefined) */
#define MAX_JOB_ID (1LL << 53)
#define MAX_ID 4294967294LL    /* uid_t/gid_t; (uid_t)-1 means "unchanged" to setuid */
#define MAX_BYTES (1LL << 62)
#define MAX_SECONDS 1e12       /* about 31,700 years: any real limit or grace */

enum { T_WARN, T_LIMIT, T_KILL, T_MEM, T_CONNECT, T_GIVE_UP, T_FENCE, T_COUNT };
enum { STEP_GROUP, STEP_CGROUP, STEP_CPUS, STEP_USER, STEP_CHDIR, STEP_STDOUT, STEP_STDERR, STEP_EXEC, STEP_TERMINAL, STEP_COUNT };
#define PTY_SOCKET "pty.sock" /* in the job folder: the terminal's master, for the agent */

typedef struct {
    long long job_id;
    const char *script, *cwd, *stdout_path, *stderr_path;
    cgroup_place place; /* cgroup_parent/cgroup_key, cgroup_delegated, job_max_pids */
    const char *cpuset, *mems; /* cpulists, or NULL: not bound */
    device_rule deny[MAX_DEVICE_RULES];
    size_t ndeny;
    size_t script_len;
    char **argv, **envp;
    int append, has_time_limit, has_mem_limit, mem_poll_only;
    int has_uid, has_gid, has_umask, warning_signal;
    double time_limit, kill_grace, warning_seconds;
    long long mem_limit;
    uid_t uid;
    gid_t gid;
    const char *user; /* with has_uid: the account's name (its passwd entry), else NULL */
    gid_t *groups;    /* with has_uid: its groups, as initgroups(3) sets them (getgrouplist) */
    int ngroups;
    mode_t umask; /* with has_umask: the job's umask; output files are 0666 less it */
    int has_terminal;  /* an interactive job: it runs on a pseudo-terminal, no output files */
    int rows, cols;    /* its window size (0: not set) */
    int stdin_tty, stdout_tty; /* the submitter's: without them no ECHO, no OPOST */
    int has_lease;     /* fenced when the lease runs out (see Fencing) */
    double lease_until; /* CLOCK_MONOTONIC seconds */
} launch_spec;

typedef struct {
    const char *job_dir;
    double ack_wait;
    pid_t me;
    launch_spec spec;
    int have_spec;
    pid_t job_pid; /* the main process; also the job's process group id */
    int status, have_status, main_gone, tree_killed;
    double tree_signalled;
    char launch_error[8400];
    char decided_state[32], decided_reason[512];
    char fence_why[300]; /* the agent's word on why its lease may run out ("": none given) */
    cgroup group; /* the job's own groups (version 0: no memory group could be made) */
    char isolation[600]; /* the device isolation applied, as reported */
    char spawned_by[64]; /* how the job's child was made (make_child), for job.pid */
    char cpu_binding[300];
    cpu_set_t affinity; /* with use_affinity: the child binds itself (no cpuset group) */
    int use_affinity;
    int group_limited; /* the group enforces --mem */
    int polling;
    long long peak;
    double started_at;
    double timers[T_COUNT];
    int timer_set[T_COUNT];
    char *result; /* the result object's JSON once the job has ended */
    int acked;
    int wake_r, wake_w;
    int sock; /* the agent link, -1 when not connected */
    int pty_master, pty_slave; /* an interactive job's terminal (-1: none); the slave until spawned */
    int pty_listen; /* pty.sock, where the agent gets the master (-1: none) */
    buf in, out;
} supervisor;

static int wake_fd = -1;

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_sigchld(int signum) {
    (void)signum;
    int saved = errno;
    if (wake_fd >= 0) (void)!write(wake_fd, "", 1);
    errno = saved;
}

static void drain(int fd) {
    char sink[512];
    while (read(fd, sink, sizeof sink) > 0) {
    }
}

static void set_timer(supervisor *s, int which, double when) {
    s->timers[which] = when;
    s->timer_set[which] = 1;
}

static void set_timer_min(supervisor *s, int which, double when) {
    if (!s->timer_set[which] || when < s->timers[which]) set_timer(s, which, when);
}

/* ---- formatting, as gpuq.domain.units does ---- */

static void format_duration(double seconds, char *out, size_t size) {
    long long total = seconds > 0 ? (long long)fmin(seconds, 1e15) : 0; /* a cast out of range is undefined */
    long long days = total / 86400, rest = total % 86400;
    if (days) snprintf(out, size, "%lld-%02lld:%02lld:%02lld", days, rest / 3600, rest % 3600 / 60, rest % 60);
    else snprintf(out, size, "%02lld:%02lld:%02lld", rest / 3600, rest % 3600 / 60, rest % 60);
}

static void format_size(long long size, char *out, size_t len) {
    static const char *const suffixes[] = {"B", "K", "M", "G", "T", "P"};
    double value = (double)size;
    size_t i = 0;
    while (value >= 1024 && i < 5) { value /= 1024; i++; }
    char text[64];
    snprintf(text, sizeof text, "%.1f", value);
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '0') text[--n] = '\0';
    if (n > 0 && text[n - 1] == '.') text[--n] = '\0';
    snprintf(out, len, "%s%s", text, suffixes[i]);
}

/* ---- files of the job folder ---- */

static int write_file(const char *path, const char *data, size_t len, mode_t mode, int chown_to, uid_t uid, gid_t gid) {
    /* only ever in the job folder, which is root's: still, never through a link */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) return -1;
    int ok = write(fd, data, len) == (ssize_t)len && fchmod(fd, mode) == 0; /* whatever the umask */
    if (ok && chown_to) ok = fchown(fd, uid, gid) == 0;
    int saved = errno;
    close(fd);
    errno = saved;
    return ok ? 0 : -1;
}

static int write_json_atomic(const char *path, const char *json) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    size_t len = strlen(json);
    int ok = write(fd, json, len) == (ssize_t)len && fsync(fd) == 0;
    close(fd);
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

static void remove_job_dir(const char *job_dir) {
    DIR *dir = opendir(job_dir);
    if (dir == NULL) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL)
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) unlinkat(dirfd(dir), entry->d_name, 0);
    closedir(dir);
    rmdir(job_dir);
}

typedef struct {
    long long job_id;
    const char *state;
    int have_code, code; /* code: the exit code, or minus the signal that killed the job */
    const char *reason;
    double started_at, ended_at;
    long long peak_mem, leftovers_killed;
    const char *isolation, *cpu_binding;
} job_end;

/* result.json's object, as the agent reads it (gpuq/agent/jobs/supervisor_reports.py,
 * SupervisorReport.ended). */
static char *result_json(const job_end *end) {
    buf out = {0};
    buf_addf(&out, "{\"job_id\":%lld,\"end_state\":\"%s\",", end->job_id, end->state);
    if (end->have_code && end->code >= 0) buf_addf(&out, "\"exit_code\":%d,\"signal\":null,", end->code);
    else if (end->have_code) buf_addf(&out, "\"exit_code\":null,\"signal\":%d,", -end->code);
    else buf_addf(&out, "\"exit_code\":null,\"signal\":null,");
    buf_addf(&out, "\"reason\":");
    buf_str(&out, end->reason);
    buf_addf(&out, ",\"started_at\":%.6f,\"ended_at\":%.6f,\"peak_mem\":%lld,\"leftovers_killed\":%lld",
             end->started_at, end->ended_at, end->peak_mem, end->leftovers_killed);
    buf_addf(&out, ",\"isolation\":");
    buf_str(&out, end->isolation ? end->isolation : "");
    buf_addf(&out, ",\"cpu_binding\":");
    buf_str(&out, end->cpu_binding ? end->cpu_binding : "");
    buf_add(&out, "}", 1);
    return out.data;
}

static void save_result(const char *job_dir, const char *json) {
    char path[4200];
    snprintf(path, sizeof path, "%s/result.json", job_dir);
    write_json_atomic(path, json);
}

static char **string_array(const jval *v, int object) {
    /* argv from a list, envp ("K=V") from an object; NULL when an item is unusable */
    size_t n = v->n;
    char **out = calloc(n + 1, sizeof *out);
    if (out == NULL) abort();
    for (size_t i = 0; i < n; i++) {
        const jval *item = &v->items[i];
        if (item->type != J_STR || strlen(item->str) != item->len) return NULL;
        if (!object) { out[i] = item->str; continue; }
        if (strchr(v->keys[i], '=') || !v->keys[i][0]) return NULL;
        buf pair = {0};
        buf_addf(&pair, "%s=%s", v->keys[i], item->str);
        out[i] = pair.data;
    }
    return out;
}

static int is_cpulist(const char *text) {
    /* "0-3,8": digits, commas and dashes, as cpuset.cpus and parse_cpulist take them */
    if (text == NULL) return 1;
    if (!text[0] || strlen(text) > 1000) return 0;
    return strspn(text, "0123456789,-") == strlen(text);
}

/* device_deny, cpuset, mems; NULL, or what is wrong. A bad rule fails the start: running the
 * job without the isolation the agent asked for would be worse. */
static const char *read_isolation(launch_spec *spec, const jval *root) {
    const jval *deny = json_get(root, "device_deny");
    if (deny != NULL && deny->type != J_NULL) {
        if (deny->type != J_ARR || deny->n > MAX_DEVICE_RULES) return "field device_deny is unusable";
        for (size_t i = 0; i < deny->n; i++) {
            const jval *rule = &deny->items[i];
            if (rule->type != J_STR || parse_device_rule(rule->str, &spec->deny[i]) != 0)
                return "field device_deny has a rule that is not \"c|b MAJOR:MINOR\"";
        }
        spec->ndeny = deny->n;
    }
    spec->cpuset = json_str(root, "cpuset", NULL);
    spec->mems = json_str(root, "mems", NULL);
    if (!is_cpulist(spec->cpuset)) return "field cpuset is not a cpulist";
    if (!is_cpulist(spec->mems)) return "field mems is not a cpulist";
    return NULL;
}

/* The account a job given a uid runs as: its passwd entry (by the spec's user name when there
 * is one, which must have that uid), its primary group unless a gid is given (never the
 * supervisor's: root's 0), and its supplementary groups as initgroups(3) would set them
 * (getgrouplist: the gid and every group the group database lists the user in). A given gid
 * must be one of them. No passwd entry: refused (no job runs as a bare number). */
static const char *resolve_account(launch_spec *spec) {
    static char why[300];
    if (!spec->has_uid) return NULL;
    struct passwd *entry = spec->user ? getpwnam(spec->user) : getpwuid(spec->uid);
    if (entry == NULL) {
        if (spec->user) snprintf(why, sizeof why, "user %.200s has no passwd entry on this node", spec->user);
        else snprintf(why, sizeof why, "uid %u has no passwd entry on this node", (unsigned)spec->uid);
        return why;
    }
    if (entry->pw_uid != spec->uid) {
        snprintf(why, sizeof why, "user %.200s is uid %u here, not %u", entry->pw_name, (unsigned)entry->pw_uid, (unsigned)spec->uid);
        return why;
    }
    if (!spec->has_gid) spec->gid = entry->pw_gid;
    int n = 64;
    gid_t *groups = calloc((size_t)n, sizeof *groups);
    if (groups == NULL) abort();
    for (int tries = 0; getgrouplist(entry->pw_name, entry->pw_gid, groups, &n) < 0; tries++) {
        if (tries > 8 || n <= 0 || n > 65536) {
            snprintf(why, sizeof why, "cannot list the groups of user %.200s", entry->pw_name);
            return why;
        }
        groups = realloc(groups, (size_t)n * sizeof *groups);
        if (groups == NULL) abort();
    }
    int member = spec->gid == entry->pw_gid;
    for (int i = 0; i < n && !member; i++) member = groups[i] == spec->gid;
    if (!member) {
        snprintf(why, sizeof why, "gid %u is not a group of user %.200s", (unsigned)spec->gid, entry->pw_name);
        return why;
    }
    spec->has_gid = 1;
    spec->groups = groups;
    spec->ngroups = n;
    spec->user = strdup(entry->pw_name);
    if (spec->user == NULL) abort();
    return NULL;
}

/* A number field: absent or null leaves *present 0 (the default applies); present, it must be a
 * number in [min, max] (so finite, never NaN), else the spec is refused: a limit that cannot be
 * read must not silently become "no limit". 0, or -1. */
static int real_field(const jval *root, const char *key, double min, double max, double *out, int *present) {
    const jval *v = json_get(root, key);
    *present = 0;
    if (v == NULL || v->type == J_NULL) return 0;
    if (v->type != J_NUM || !(v->num >= min && v->num <= max)) return -1;
    *out = v->num;
    *present = 1;
    return 0;
}

/* The same for a whole number (range-checked as a double before the cast). */
static int int_field(const jval *root, const char *key, long long min, long long max, long long *out, int *present) {
    const jval *v = json_get(root, key);
    *present = 0;
    if (v == NULL || v->type == J_NULL) return 0;
    if (!json_int(root, key, min, max, out)) return -1;
    *present = 1;
    return 0;
}

/* A flag: absent or null leaves `fallback`; 0 when of another type. */
static int bool_field(const jval *object, const char *key, int fallback, int *out) {
    const jval *v = json_get(object, key);
    *out = fallback;
    if (v == NULL || v->type == J_NULL) return 1;
    if (v->type != J_BOOL) return 0;
    *out = v->boolean;
    return 1;
}

/* terminal: absent or null, a batch job; else {"rows","cols","stdin_tty","stdout_tty"} (the
 * term goes to the job as TERM in its environment). NULL, or what is wrong. */
static const char *read_terminal(launch_spec *spec, const jval *root) {
    const jval *terminal = json_get(root, "terminal");
    long long rows = 0, cols = 0;
    int present;
    if (terminal == NULL || terminal->type == J_NULL) return NULL;
    if (terminal->type != J_OBJ) return "field terminal is not an object";
    if (int_field(terminal, "rows", 0, 65535, &rows, &present) != 0 || int_field(terminal, "cols", 0, 65535, &cols, &present) != 0)
        return "field terminal has rows or cols out of 0 to 65535";
    if (!bool_field(terminal, "stdin_tty", 1, &spec->stdin_tty) || !bool_field(terminal, "stdout_tty", 1, &spec->stdout_tty))
        return "field terminal has stdin_tty or stdout_tty that is not a boolean";
    spec->has_terminal = 1;
    spec->rows = (int)rows;
    spec->cols = (int)cols;
    return NULL;
}

/* cgroup_parent and cgroup_key (one name: [A-Za-z0-9_-], never "." or ".."); the job's groups
 * are <parent>/<key>/job_<id>. NULL, or the field that is unusable. */
static const char *cgroup_location(launch_spec *spec, const jval *root) {
    static char joined[1200];
    const char *parent = NULL, *key = NULL;
    const jval *p = json_get(root, "cgroup_parent"), *k = json_get(root, "cgroup_key");
    if (p != NULL && p->type != J_NULL && !json_cstr(root, "cgroup_parent", &parent)) return "cgroup_parent";
    if (k != NULL && k->type != J_NULL && !json_cstr(root, "cgroup_key", &key)) return "cgroup_key";
    /* the parent is the admin's (gpuq/config checks its parts); the key is the agent's */
    if (parent && strlen(parent) > 1000) return "cgroup_parent";
    if (key && (!key[0] || strlen(key) > 64 || strspn(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(key)))
        return "cgroup_key";
    const jval *d = json_get(root, "cgroup_delegated");
    if (d != NULL && d->type != J_NULL && (!json_cstr(root, "cgroup_delegated", &spec->place.delegated) || strlen(spec->place.delegated) > 1000))
        return "cgroup_delegated";
    int present = 0;
    if (int_field(root, "job_max_pids", 0, 1LL << 31, &spec->place.max_pids, &present) != 0) return "job_max_pids";
    if (key == NULL) { spec->place.parent = parent; return NULL; }
    const char *base = parent && parent[0] ? parent : "gpuq";
    size_t len = strlen(base);
    while (len > 0 && base[len - 1] == '/') len--;
    snprintf(joined, sizeof joined, "%.*s/%s", (int)len, base, key);
    spec->place.parent = joined;
    return NULL;
}

static int read_spec(supervisor *s, const char *text, size_t len, const char **problem) {
    static char bad[400];
    launch_spec *spec = &s->spec;
    jval *root = json_parse(text, len);
    const char *field = NULL;
    *problem = "spec.json is not a JSON object";
    if (root == NULL || root->type != J_OBJ) return -1;
    const jval *script = json_get(root, "script");
    const jval *args = json_get(root, "args"), *env = json_get(root, "env");
    char **argv = args && args->type == J_ARR ? string_array(args, 0) : NULL;
    spec->envp = env && env->type == J_OBJ ? string_array(env, 1) : NULL;
    long long job_id = 0, uid = 0, gid = 0, number = 0;
    if (!json_int(root, "job_id", 0, MAX_JOB_ID, &job_id)) field = "job_id";
    else if (script == NULL || script->type != J_STR) field = "script";
    else if (!json_cstr(root, "cwd", &spec->cwd)) field = "cwd";
    else if (!json_cstr(root, "stdout_path", &spec->stdout_path)) field = "stdout_path";
    else if (!json_cstr(root, "stderr_path", &spec->stderr_path)) field = "stderr_path";
    else if (argv == NULL) field = "args";
    else if (spec->envp == NULL) field = "env";
    /* a user that cannot be switched to must not run the job as this one (root) */
    else if (int_field(root, "uid", 0, MAX_ID, &uid, &spec->has_uid) != 0) field = "uid";
    else if (int_field(root, "gid", 0, MAX_ID, &gid, &spec->has_gid) != 0) field = "gid";
    if (field != NULL) {
        snprintf(bad, sizeof bad, "spec.json: field %s is missing or unusable", field);
        *problem = bad;
        return -1;
    }
    spec->job_id = job_id;
    spec->script = script->str; /* may hold NUL bytes: written with its length */
    spec->script_len = script->len;
    spec->argv = calloc(args->n + 2, sizeof *spec->argv);
    if (spec->argv == NULL) abort();
    spec->argv[0] = NULL; /* the script's path, set when it is written */
    memcpy(spec->argv + 1, argv, args->n * sizeof *argv);
    spec->append = strcmp(json_str(root, "open_mode", "truncate"), "append") == 0;
    /* a limit that is there must be usable: out of range, NaN or infinite refuses the spec
     * rather than silently meaning "no limit" (checked before any cast, which would be
     * undefined). The warning signal and the umask fall back to their defaults (SIGTERM;
     * output files 0600), which only err on the safe side. */
    int present = 0;
    double grace = 30.0, warn_seconds = 0.0;
    long long umask_value = 0;
    if (real_field(root, "time_limit", 0, MAX_SECONDS, &spec->time_limit, &spec->has_time_limit) != 0) field = "time_limit";
    else if (int_field(root, "mem_limit", 0, MAX_BYTES, &spec->mem_limit, &spec->has_mem_limit) != 0) field = "mem_limit";
    else if (real_field(root, "kill_grace", 0, MAX_SECONDS, &grace, &present) != 0) field = "kill_grace";
    else if (real_field(root, "warning_seconds", 0, MAX_SECONDS, &warn_seconds, &present) != 0) field = "warning_seconds";
    else if (real_field(root, "lease_until", 0, MAX_SECONDS, &spec->lease_until, &spec->has_lease) != 0) field = "lease_until";
    else if ((field = cgroup_location(spec, root)) != NULL) {
    }
    else if (json_get(root, "user") && json_get(root, "user")->type != J_NULL && !json_cstr(root, "user", &spec->user)) field = "user";
    else if (spec->user && !spec->has_uid) field = "user (without uid)";
    if (field != NULL) {
        snprintf(bad, sizeof bad, "spec.json: field %s is unusable (of another type, or out of range)", field);
        *problem = bad;
        return -1;
    }
    if (!spec->has_time_limit) spec->time_limit = -1;
    spec->mem_poll_only = strcmp(json_str(root, "mem_enforcement", "auto"), "poll") == 0;
    spec->kill_grace = grace;
    spec->warning_signal = json_int(root, "warning_signal", 1, NSIG - 1, &number) ? (int)number : SIGTERM;
    spec->warning_seconds = warn_seconds;
    spec->uid = (uid_t)uid;
    spec->gid = (gid_t)gid;
    spec->has_umask = json_int(root, "umask", 0, 0777, &umask_value);
    spec->umask = spec->has_umask ? (mode_t)umask_value : 0;
    if ((field = read_isolation(spec, root)) != NULL || (field = read_terminal(spec, root)) != NULL
        || (field = resolve_account(spec)) != NULL) {
        snprintf(bad, sizeof bad, "spec.json: %s", field);
        *problem = bad;
        return -1;
    }
    s->have_spec = 1;
    return 0; /* root is kept: the spec's strings point into it */
}

/* ---- starting the job ---- */

/* why an output file was refused (beyond an errno): its kind, its owner, its mode */
enum { REFUSED_NONE, REFUSED_LINK, REFUSED_KIND, REFUSED_OWNER, REFUSED_LINKS, REFUSED_MODE };

typedef struct {
    int step, err;
    int refused;    /* REFUSED_*: an output file the job must not write into */
    unsigned owner; /* with REFUSED_OWNER: the file's uid */
    unsigned mode;  /* with REFUSED_KIND/REFUSED_MODE: its st_mode */
} launch_failure;

static void __attribute__((noreturn)) child_fail(int fd, int step) {
    launch_failure failure = {step, errno, REFUSED_NONE, 0, 0};
    (void)!write(fd, &failure, sizeof failure);
    _exit(127);
}

static void __attribute__((noreturn)) output_refused(int fd, int step, int refused, const struct stat *st) {
    launch_failure failure = {step, 0, refused, st ? (unsigned)st->st_uid : 0, st ? (unsigned)st->st_mode : 0};
    (void)!write(fd, &failure, sizeof failure);
    _exit(127);
}

/* Runs in the child (of vfork, or of clone3 with fork semantics): system calls only, then exec
 * or _exit; a failure travels to the supervisor through err_fd, never through memory. */
typedef struct {
    const launch_spec *spec;
    const char *script;
    int cgroup_fds[CG_ROLES], cgroup_required[CG_ROLES], ncgroups; /* where it joins each group */
    /* the job's v2 group, where the child is born (clone3, CLONE_INTO_CGROUP) rather than
     * moved: its index in cgroup_fds (whose fd is opened only if that fails), its folder, and
     * the folder open for clone3; -1, NULL, -1: none */
    int v2_index, v2_dir;
    const char *v2_folder;
    int born; /* set in the child of clone3 only: it is in group v2_index already */
    int ngroups, err_fd;
    int tty; /* an interactive job's terminal (the slave), or -1 */
    gid_t *groups;
    const cpu_set_t *affinity; /* NULL: no binding here */
} child_args;

static void __attribute__((noreturn)) exec_job(const child_args *a, int target);

static int is_dev_null(const struct stat *st) {
    struct stat null;
    if (!S_ISCHR(st->st_mode)) return 0;
    if (stat("/dev/null", &null) == 0 && S_ISCHR(null.st_mode)) return st->st_rdev == null.st_rdev;
    return st->st_rdev == makedev(1, 3);
}

/* Whether users other than the job's may write in the folder holding `path`: a group- or
 * world-writable folder (sticky or not), or one another user owns (root is trusted). */
static int folder_shared(const char *path, uid_t uid) {
    char folder[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash == NULL ? 0 : (slash == path ? 1 : (size_t)(slash - path));
    if (n >= sizeof folder) return 1;
    if (n == 0) strcpy(folder, ".");
    else {
        memcpy(folder, path, n);
        folder[n] = '\0';
    }
    struct stat st;
    if (stat(folder, &st) != 0) return 1;
    return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 || (st.st_uid != uid && st.st_uid != 0);
}

/* An output file, opened as the job's user (in the job's child: system calls only) so that
 * another user cannot plant it: never through a final symlink (O_NOFOLLOW), never blocking
 * on a FIFO (O_NONBLOCK for the open), a regular file or /dev/null only. A file that already
 * exists in a folder others can write to must be the user's, have no other hard link, and be
 * writable by group or others only as far as the user's own umask would have made it; it is
 * truncated (unless appending) only once it has passed. */
static int open_output(const launch_spec *spec, const char *path, mode_t mode, int err_fd, int step) {
    int base = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (spec->append ? O_APPEND : 0);
    uid_t uid = spec->has_uid ? spec->uid : getuid();
    struct stat st;
    int fd = -1, created = 0;
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        fd = open(path, base | O_CREAT | O_EXCL, mode);
        if (fd >= 0) {
            created = 1;
            break;
        }
        if (errno != EEXIST) child_fail(err_fd, step);
        /* it exists: look before opening (a device's open may act) */
        if (lstat(path, &st) != 0) {
            if (errno == ENOENT) continue; /* gone meanwhile: create it again */
            child_fail(err_fd, step);
        }
        if (S_ISLNK(st.st_mode)) output_refused(err_fd, step, REFUSED_LINK, &st);
        if (!S_ISREG(st.st_mode) && !is_dev_null(&st)) output_refused(err_fd, step, REFUSED_KIND, &st);
        fd = open(path, base, 0);
        if (fd >= 0) break;
        if (errno == ENOENT) continue;
        if (errno == ELOOP) output_refused(err_fd, step, REFUSED_LINK, NULL);
        if (errno == ENXIO) { /* a FIFO without a reader, or a socket, put there meanwhile */
            st.st_mode = S_IFIFO;
            output_refused(err_fd, step, REFUSED_KIND, &st);
        }
        child_fail(err_fd, step);
    }
    if (fd < 0) {
        errno = ENOENT;
        child_fail(err_fd, step);
    }
    if (fstat(fd, &st) != 0) child_fail(err_fd, step);
    if (!S_ISREG(st.st_mode) && !is_dev_null(&st)) output_refused(err_fd, step, REFUSED_KIND, &st);
    if (S_ISREG(st.st_mode) && !created) {
        if (folder_shared(path, uid)) {
            mode_t own = spec->has_umask ? 0666 & ~spec->umask : 0600; /* what the user's jobs create */
            if (st.st_uid != uid) output_refused(err_fd, step, REFUSED_OWNER, &st);
            if (st.st_nlink != 1) output_refused(err_fd, step, REFUSED_LINKS, &st);
            if (st.st_mode & (S_IWGRP | S_IWOTH) & ~own) output_refused(err_fd, step, REFUSED_MODE, &st);
        }
        if (!spec->append && ftruncate(fd, 0) != 0) child_fail(err_fd, step);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) child_fail(err_fd, step);
    return fd;
}

static void __attribute__((noreturn)) child(const child_args *a) {
    const launch_spec *spec = a->spec;
    const char *script = a->script;
    int ngroups = a->ngroups, err_fd = a->err_fd;
    gid_t *groups = a->groups;
    int target = -1;
    /* an interactive job leads a session of its own whose controlling terminal is its pty (so
     * that ^C, ^Z and SIGWINCH reach it, as on a login); a batch job only leads a group */
    if (a->tty >= 0) {
        if (setsid() < 0 || ioctl(a->tty, TIOCSCTTY, 0) != 0) child_fail(err_fd, STEP_TERMINAL);
    } else if (setpgid(0, 0) != 0) child_fail(err_fd, STEP_GROUP);
    /* "0": me; a group that only gathers the job's processes is worth no failed start, one
     * that enforces (--mem, device rules, CPUs) is: the job must not run without it. The v2
     * group a clone3 child was born in needs no write (v1 groups on a hybrid host still do). */
    for (int i = 0; i < a->ncgroups; i++)
        if (!(a->born && i == a->v2_index) && (a->cgroup_fds[i] < 0 || write(a->cgroup_fds[i], "0", 1) != 1)
            && a->cgroup_required[i])
            child_fail(err_fd, STEP_CGROUP);
    if (a->affinity != NULL && sched_setaffinity(0, sizeof *a->affinity, a->affinity) != 0) child_fail(err_fd, STEP_CPUS);
    /* the user's identity before anything a user named is touched (the working folder, the
     * output files, the script): root trusts no user path. Groups, then gid, then uid (after
     * setuid the others can no longer be changed). */
    if (groups != NULL || spec->has_gid) {
        if (groups != NULL) {
            /* the script, opened as root, for a job folder the user cannot reach (a root run
             * folder that is not 0711): exec'd through the fd only if the path fails */
            target = open(script, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (target < 0) child_fail(err_fd, STEP_USER);
        }
        if (setgroups(groups ? (size_t)ngroups : 0, groups) != 0) child_fail(err_fd, STEP_USER);
        if (spec->has_gid && setgid(spec->gid) != 0) child_fail(err_fd, STEP_USER);
        if (spec->has_uid && setuid(spec->uid) != 0) child_fail(err_fd, STEP_USER);
        /* never go on with root's ids left over: verify what the kernel says */
        if (spec->has_uid && (getuid() != spec->uid || geteuid() != spec->uid)) child_fail(err_fd, STEP_USER);
        if (spec->has_gid && (getgid() != spec->gid || getegid() != spec->gid)) child_fail(err_fd, STEP_USER);
    }
    if (chdir(spec->cwd) != 0) child_fail(err_fd, STEP_CHDIR);
    if (a->tty >= 0) {
        if (spec->has_umask) umask(spec->umask);
        if (dup2(a->tty, 0) < 0 || dup2(a->tty, 1) < 0 || dup2(a->tty, 2) < 0) child_fail(err_fd, STEP_TERMINAL);
        exec_job(a, target);
    }
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, 0) < 0) child_fail(err_fd, STEP_CHDIR);
    /* the submitter's umask, for the output files and for what the job creates (this child has
     * its own umask: even vfork shares memory, not the fs attributes); an existing file keeps
     * its mode */
    mode_t mode = 0600;
    if (spec->has_umask) {
        umask(spec->umask);
        mode = 0666;
    }
    int out = open_output(spec, spec->stdout_path, mode, err_fd, STEP_STDOUT);
    int err = out;
    if (strcmp(spec->stderr_path, spec->stdout_path) != 0) err = open_output(spec, spec->stderr_path, mode, err_fd, STEP_STDERR);
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0) child_fail(err_fd, STEP_STDOUT);
    exec_job(a, target);
}

/* The end of child(): default signal handling, then the script (by path, else by fd). */
static void __attribute__((noreturn)) exec_job(const child_args *a, int target) {
    const launch_spec *spec = a->spec;
    const char *script = a->script;
    int err_fd = a->err_fd;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(script, spec->argv, spec->envp);
    if (target >= 0 && (errno == EACCES || errno == ENOENT || errno == ENOTDIR)) {
        /* the folder is not the user's to traverse: through the fd (which a script's
         * interpreter then reads as /dev/fd/N, so it must stay open across the exec) */
        if (fcntl(target, F_SETFD, 0) == 0) fexecve(target, spec->argv, spec->envp);
    }
    child_fail(err_fd, STEP_EXEC);
}

/* Nothing of this frame is live across vfork, so the child (on a deeper frame) clobbers
 * nothing the parent needs. */
static pid_t __attribute__((noinline)) vfork_child(const child_args *args) {
    pid_t pid = vfork();
    if (pid == 0) child(args);
    return pid;
}

/* clone3's arguments up to `cgroup` (CLONE_ARGS_SIZE_VER2), spelled out: linux/sched.h, which
 * has them, redefines what glibc's <sched.h> defines */
typedef struct {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
} clone3_args;

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/* The child, born in the job's v2 group: CLONE_INTO_CGROUP puts it there as it is made, so it
 * never migrates (a migration takes cgroup_threadgroup_rwsem for writing, which without the
 * favordynmods mount option waits an RCU grace period: 10 to 16 ms of a job's start). Fork
 * semantics (glibc has no clone3 wrapper, and a raw one with CLONE_VM would return into this
 * frame on the shared stack): the child's memory is a copy, which child() never relies on
 * sharing. -1 with errno where the kernel refuses (before 5.7, a seccomp filter, a group that
 * takes no process). */
static pid_t clone3_child(child_args *args) {
#ifdef SYS_clone3
    clone3_args how = {.flags = CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)args->v2_dir};
    long pid = syscall(SYS_clone3, &how, sizeof how);
    if (pid == 0) {
        args->born = 1; /* the child's own copy */
        child(args);
    }
    return (pid_t)pid;
#else
    (void)args;
    errno = ENOSYS;
    return -1;
#endif
}

/* The job's child: born in its v2 group where there is one and the kernel allows it, else
 * vfork'd and joining every group by writing, as before clone3 (so that nothing gets worse
 * where clone3 is refused: a required group that cannot be joined either way still fails the
 * start). `how` says which: "clone3", "vfork", or "vfork:<errno name, or number>" after clone3
 * refused. */
static pid_t make_child(child_args *args, int *v2_procs, char *how, size_t size) {
    snprintf(how, size, "vfork");
    if (args->v2_dir >= 0) {
        pid_t pid = clone3_child(args);
        if (pid > 0) {
            snprintf(how, size, "clone3");
            return pid;
        }
        int refused = errno;
        const char *name = NULL;
#ifdef __GLIBC__
#if __GLIBC_PREREQ(2, 32)
        name = strerrorname_np(refused);
#endif
#endif
        if (name != NULL) snprintf(how, size, "vfork:%s", name);
        else snprintf(how, size, "vfork:%d", refused);
    }
    if (args->v2_index >= 0) /* the fallback joins it by writing, as every other group */
        args->cgroup_fds[args->v2_index] = *v2_procs = cgroup_open_procs(args->v2_folder);
    return vfork_child(args);
}

static const char *file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISDIR(mode)) return "a folder";
    return "not a regular file";
}

/* The one line that names a refused output file and why (in the supervisor, not the child:
 * the owner's name needs the passwd database). */
static void output_refusal(char *out, size_t size, const char *path, const launch_failure *f) {
    char owner[300];
    struct passwd *entry = f->refused == REFUSED_OWNER ? getpwuid((uid_t)f->owner) : NULL;
    if (entry != NULL) snprintf(owner, sizeof owner, "%.200s", entry->pw_name);
    else snprintf(owner, sizeof owner, "uid %u", f->owner);
    if (f->refused == REFUSED_LINK)
        snprintf(out, size, "launch failed: output file %s is a symbolic link; refusing to write through it", path);
    else if (f->refused == REFUSED_KIND)
        snprintf(out, size, "launch failed: output file %s is %s, not a regular file; refusing to write into it", path, file_kind(f->mode));
    else if (f->refused == REFUSED_OWNER)
        snprintf(out, size, "launch failed: output file %s belongs to %s; refusing to write into a file another user planted", path, owner);
    else if (f->refused == REFUSED_LINKS)
        snprintf(out, size, "launch failed: output file %s has another hard link, in a folder other users can write to; refusing to write into it", path);
    else
        snprintf(out, size, "launch failed: output file %s is writable by other users (mode %04o), in a folder other users can write to; refusing to write into it", path, f->mode & 07777);
}

static void spawn_job(supervisor *s, const char *script, child_args *joins) {
    static const char *const steps[] = {"create a process group", "join the job's cgroup", "bind the job's CPUs", "switch user", "chdir to ", "open ", "open ", "execute ", "attach the job's terminal"};
    const launch_spec *spec = &s->spec;
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
        snprintf(s->launch_error, sizeof s->launch_error, "launch failed: cannot create a pipe: %s", strerror(errno));
        return;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old); /* no handler of ours may run in the child */
    child_args args = *joins;
    args.spec = spec;
    args.script = script;
    args.ngroups = spec->has_uid ? spec->ngroups : 0;
    args.err_fd = pipe_fds[1];
    args.tty = s->pty_slave;
    args.groups = spec->has_uid ? spec->groups : NULL;
    args.born = 0;
    int v2_procs = -1;
    pid_t pid = make_child(&args, &v2_procs, s->spawned_by, sizeof s->spawned_by);
    int fork_errno = errno;
    if (joins->v2_index >= 0) joins->cgroup_fds[joins->v2_index] = v2_procs; /* start() closes it */
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(pipe_fds[1]);
    if (pid < 0) {
        close(pipe_fds[0]);
        snprintf(s->launch_error, sizeof s->launch_error, "launch failed: cannot fork: %s", strerror(fork_errno));
        return;
    }
    s->job_pid = pid;
    launch_failure failure;
    ssize_t n;
    do n = read(pipe_fds[0], &failure, sizeof failure); while (n < 0 && errno == EINTR);
    close(pipe_fds[0]);
    if (n != (ssize_t)sizeof failure) return; /* EOF without a report: exec happened */
    const char *detail = "";
    if (failure.step == STEP_CHDIR) detail = spec->cwd;
    else if (failure.step == STEP_STDOUT) detail = spec->stdout_path;
    else if (failure.step == STEP_STDERR) detail = spec->stderr_path;
    else if (failure.step == STEP_EXEC) detail = script;
    const char *step = failure.step >= 0 && failure.step < STEP_COUNT ? steps[failure.step] : "start";
    if (failure.refused != REFUSED_NONE && (failure.step == STEP_STDOUT || failure.step == STEP_STDERR))
        output_refusal(s->launch_error, sizeof s->launch_error, detail, &failure);
    else snprintf(s->launch_error, sizeof s->launch_error, "launch failed: cannot %s%s: %s", step, detail, strerror(failure.err));
}

/* ---- the agent link ---- */

static void link_close(supervisor *s) {
    if (s->sock < 0) return;
    close(s->sock);
    s->sock = -1;
    s->in.len = s->out.len = 0;
    set_timer(s, T_CONNECT, monotonic() + RECONNECT_DELAY);
}

static void link_flush(supervisor *s) {
    while (s->sock >= 0 && s->out.len > 0) {
        ssize_t sent = send(s->sock, s->out.data, s->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (sent < 0) { link_close(s); return; }
        buf_consume(&s->out, (size_t)sent);
    }
}

static void link_send(supervisor *s, buf *message) {
    if (s->sock < 0) return;
    buf_add(&s->out, message->data, message->len);
    buf_add(&s->out, "\n", 1);
    link_flush(s);
}

static void send_hello(supervisor *s) {
    buf hello = {0};
    buf_addf(&hello, "{\"type\":\"hello\",\"job_id\":%lld,\"pid\":%d,\"job_pid\":%d,\"started_at\":%.6f,", s->spec.job_id, s->me, s->job_pid, s->started_at);
    buf_addf(&hello, "\"isolation\":");
    buf_str(&hello, s->isolation);
    buf_addf(&hello, ",\"cpu_binding\":");
    buf_str(&hello, s->cpu_binding);
    buf_add(&hello, ",", 1);
    if (s->result == NULL) buf_addf(&hello, "\"status\":\"running\"}");
    else buf_addf(&hello, "\"status\":\"ended\",\"result\":%s}", s->result);
    link_send(s, &hello);
    free(hello.data);
}

static void link_connect(supervisor *s) {
    s->timer_set[T_CONNECT] = 0;
    if (s->sock >= 0) return;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    /* <state>/agent.sock, for the folder <state>/jobs/<id> */
    const char *end = s->job_dir + strlen(s->job_dir);
    for (int slashes = 0; end > s->job_dir && slashes < 2; end--)
        if (end[-1] == '/') slashes++;
    int n = snprintf(address.sun_path, sizeof address.sun_path, "%.*s/agent.sock", (int)(end - s->job_dir), s->job_dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || n >= (int)sizeof address.sun_path) {
        if (fd >= 0) close(fd);
        set_timer(s, T_CONNECT, monotonic() + RECONNECT_DELAY);
        return;
    }
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        int backlog_full = errno == EAGAIN || errno == EINPROGRESS;
        close(fd);
        set_timer(s, T_CONNECT, monotonic() + (backlog_full ? BACKLOG_DELAY : RECONNECT_DELAY));
        return;
    }
    s->sock = fd;
    s->in.len = s->out.len = 0;
    send_hello(s);
}

/* ---- limits and commands ---- */

static void decide(supervisor *s, const char *state, const char *reason) {
    if (s->decided_state[0]) return;
    snprintf(s->decided_state, sizeof s->decided_state, "%s", state);
    snprintf(s->decided_reason, sizeof s->decided_reason, "%s", reason);
}

static void signal_job(supervisor *s, int sig) {
    static pidlist extra;
    s->tree_signalled = monotonic();
    cgroup_pids(&s->group, &extra);
    signal_tree(s->me, s->job_pid, sig, &extra);
}

static void on_kill(supervisor *s) {
    s->timer_set[T_WARN] = 0;
    s->tree_killed = 1;
    signal_job(s, SIGKILL);
    set_timer(s, T_KILL, monotonic() + KILL_RETRY);
}

static void on_limit(supervisor *s) {
    char limit[64], reason[128];
    format_duration(s->spec.time_limit, limit, sizeof limit);
    snprintf(reason, sizeof reason, "time limit %s reached", limit);
    decide(s, "timeout", reason);
    /* as SLURM: the warning signal (--signal) went earlier; the limit itself is SIGTERM */
    s->timer_set[T_WARN] = 0;
    signal_job(s, SIGTERM);
    set_timer_min(s, T_KILL, monotonic() + s->spec.kill_grace);
}

static void mem_reason(supervisor *s, char *out, size_t size) {
    char limit[64];
    format_size(s->spec.mem_limit, limit, sizeof limit);
    snprintf(out, size, "exceeded --mem %s", limit);
}

/* the kernel's OOM kill in a v2 group (memory.oom.group): the whole job went, not one process */
static void oom_reason(supervisor *s, char *out, size_t size) {
    mem_reason(s, out, size);
    size_t n = strlen(out);
    if (s->group.version == 2)
        snprintf(out + n, size - n, ": the kernel's OOM killer ended the whole job (memory.oom.group)");
}

static void on_mem(supervisor *s) {
    static pidlist tree;
    descendants(s->me, &tree);
    long long rss = tree_rss(&tree);
    if (rss > s->peak) s->peak = rss;
    if (rss > s->spec.mem_limit && !s->decided_state[0]) {
        char reason[128];
        mem_reason(s, reason, sizeof reason);
        decide(s, "out_of_memory", reason);
        on_kill(s);
        return;
    }
    set_timer(s, T_MEM, monotonic() + MEM_POLL_INTERVAL);
}

static void on_stop(supervisor *s, const jval *message) {
    if (s->result != NULL) return;
    const char *state = json_str(message, "end_state", "");
    /* node_fail: the agent fenced the job (it lost the coordinator for too long);
     * out_of_memory: the agent measured it over its GPU share (MPS);
     * failed: the agent ended it for its output (over max_output) */
    if (strcmp(state, "cancelled") != 0 && strcmp(state, "preempted") != 0 && strcmp(state, "timeout") != 0
        && strcmp(state, "node_fail") != 0 && strcmp(state, "out_of_memory") != 0
        && strcmp(state, "failed") != 0)
        state = "cancelled";
    const char *reason = json_str(message, "reason", "");
    char fallback[64];
    if (!reason[0]) {
        snprintf(fallback, sizeof fallback, "%s by the agent", state);
        reason = fallback;
    }
    decide(s, state, reason);
    s->timer_set[T_WARN] = 0; /* it is being stopped: a time-limit warning would come too late */
    long long sig;
    signal_job(s, json_int(message, "signal", 1, NSIG - 1, &sig) ? (int)sig : SIGTERM);
    double grace = json_real(message, "grace", 0, MAX_SECONDS, s->spec.kill_grace);
    set_timer_min(s, T_KILL, monotonic() + grace);
}

static void on_fence(supervisor *s) {
    /* the lease ran out: the coordinator may give the job to another node once the kill grace
     * has passed, so it stops here now, whatever the agent is doing */
    if (s->result != NULL) return;
    char reason[512];
    if (s->fence_why[0]) snprintf(reason, sizeof reason, "fenced: %s", s->fence_why);
    else if (s->sock < 0) snprintf(reason, sizeof reason, "fenced: the node's agent is gone, and the coordinator gives its jobs up");
    else snprintf(reason, sizeof reason, "fenced: the node's agent stopped answering (frozen or overloaded), and the coordinator gives its jobs up");
    if (!s->decided_state[0]) { /* a stop under way keeps its state, but not a longer grace */
        decide(s, "node_fail", reason);
        s->timer_set[T_WARN] = 0;
        signal_job(s, SIGTERM);
    }
    set_timer_min(s, T_KILL, monotonic() + s->spec.kill_grace);
}

static void on_lease(supervisor *s, const jval *message) {
    /* a lease only moves while the job runs and has not been fenced */
    if (s->result != NULL || s->decided_state[0]) return;
    double until = json_real(message, "until", 0, MAX_SECONDS, -1.0);
    if (until < 0) return;
    const char *why = json_str(message, "why", "");
    snprintf(s->fence_why, sizeof s->fence_why, "%s", why);
    s->spec.has_lease = 1;
    s->spec.lease_until = until;
    set_timer(s, T_FENCE, until);
}

static void on_message(supervisor *s, const char *line, size_t len) {
    jval *message = json_parse(line, len); /* a broken line is dropped: a bug must not kill the job */
    const char *type = json_str(message, "type", "");
    if (strcmp(type, "stop") == 0) on_stop(s, message);
    else if (strcmp(type, "lease") == 0) on_lease(s, message);
    else if (strcmp(type, "signal") == 0 && s->result == NULL) {
        long long sig;
        if (json_int(message, "signal", 0, NSIG - 1, &sig)) signal_job(s, (int)sig);
    } else if (strcmp(type, "ack") == 0 && s->result != NULL) s->acked = 1;
    json_free(message);
}

static void on_link(supervisor *s, short events) {
    if (events & POLLOUT) link_flush(s);
    if (s->sock < 0 || !(events & (POLLIN | POLLHUP | POLLERR))) return;
    char chunk[65536];
    ssize_t n = recv(s->sock, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) { link_close(s); return; }
    buf_add(&s->in, chunk, (size_t)n);
    char *newline;
    while (s->sock >= 0 && (newline = memchr(s->in.data, '\n', s->in.len)) != NULL) {
        size_t line = (size_t)(newline - s->in.data);
        on_message(s, s->in.data, line);
        buf_consume(&s->in, line + 1);
    }
}

/* ---- the end ---- */

static void reap(supervisor *s) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        if (pid == s->job_pid) { s->status = status; s->have_status = 1; s->main_gone = 1; }
    }
}

static long long kill_leftovers(supervisor *s) {
    /* SIGKILL and reap whatever of the job is alive; processes dying from a signal the whole
     * tree just got (a stop's SIGTERM) get SETTLE seconds before they count as leftovers */
    pidlist tree = {0}, extra = {0}, killed = {0};
    double now = monotonic(), deadline = now + LEFTOVER_DEADLINE;
    double settle_until = now - s->tree_signalled < 2.0 ? s->tree_signalled + SETTLE : 0.0;
    for (;;) {
        reap(s);
        descendants(s->me, &tree);
        cgroup_pids(&s->group, &extra);
        for (size_t i = 0; i < extra.n; i++)
            if (!pids_has(&tree, extra.pids[i])) pids_add(&tree, extra.pids[i]);
        if (tree.n == 0 && !group_alive(s->job_pid)) break; /* nothing left, not even a zombie */
        int any_alive = 0;
        int settling = monotonic() < settle_until;
        for (size_t i = 0; i < tree.n; i++) {
            if (has_exited(tree.pids[i])) continue;
            any_alive = 1;
            if (!settling && !pids_has(&killed, tree.pids[i])) pids_add(&killed, tree.pids[i]);
        }
        if (any_alive && !settling) signal_job(s, SIGKILL);
        if (monotonic() > deadline) break;
        struct pollfd wake = {s->wake_r, POLLIN, 0};
        poll(&wake, 1, 10);
        drain(s->wake_r);
    }
    long long count = s->tree_killed ? 0 : (long long)killed.n;
    free(tree.pids);
    free(extra.pids);
    free(killed.pids);
    return count;
}

static void finish(supervisor *s) {
    long long leftovers = kill_leftovers(s);
    char state[32], reason[9000], signame[32];
    int code = 0, have_code = !s->launch_error[0] && s->have_status;
    if (have_code) code = WIFEXITED(s->status) ? WEXITSTATUS(s->status) : -WTERMSIG(s->status);
    if (!have_code) {
        snprintf(state, sizeof state, "failed");
        snprintf(reason, sizeof reason, "%s", s->launch_error[0] ? s->launch_error : "launch failed");
    } else if (s->decided_state[0]) {
        snprintf(state, sizeof state, "%s", s->decided_state);
        snprintf(reason, sizeof reason, "%s", s->decided_reason);
    } else if (s->group_limited && cgroup_oom_kills(&s->group) > 0) {
        snprintf(state, sizeof state, "out_of_memory");
        oom_reason(s, reason, sizeof reason);
    } else if (code == 0) {
        snprintf(state, sizeof state, "completed");
        reason[0] = '\0';
    } else if (code > 0) {
        snprintf(state, sizeof state, "failed");
        snprintf(reason, sizeof reason, "exit code %d", code);
    } else {
        signal_name(-code, signame, sizeof signame);
        snprintf(state, sizeof state, "failed");
        snprintf(reason, sizeof reason, "killed by signal %s", signame);
    }
    long long refused = cgroup_pids_refused(&s->group);
    if (refused > 0) { /* its forks failed with EAGAIN: say why, or it reads as a bug of the job's */
        size_t n = strlen(reason);
        snprintf(reason + n, sizeof reason - n, "%s%lld %s refused: the job reached pids.max (%lld processes and threads)", n ? "; " : "", refused, refused == 1 ? "fork" : "forks", s->spec.place.max_pids);
    }
    if (leftovers) {
        size_t n = strlen(reason);
        snprintf(reason + n, sizeof reason - n, "%s%lld leftover %s killed", n ? "; " : "", leftovers, leftovers == 1 ? "process" : "processes");
    }
    long long peak = s->peak;
    long long group_peak = cgroup_peak(&s->group);
    if (group_peak > peak) peak = group_peak;
    cgroup_remove(&s->group);
    job_end end = {s->spec.job_id, state, have_code, code, reason, s->started_at, wall_time(), peak, leftovers, s->isolation, s->cpu_binding};
    s->result = result_json(&end);
    save_result(s->job_dir, s->result);
    memset(s->timer_set, 0, sizeof s->timer_set);
    set_timer(s, T_GIVE_UP, monotonic() + s->ack_wait);
    if (s->sock >= 0) {
        buf ended = {0};
        buf_addf(&ended, "{\"type\":\"ended\",\"job_id\":%lld,\"result\":%s}", s->spec.job_id, s->result);
        link_send(s, &ended);
        free(ended.data);
    } else {
        set_timer(s, T_CONNECT, monotonic());
    }
}

/* ---- start and loop ---- */

static int prepare(supervisor *s, char *script, size_t script_size, char *problem, size_t size) {
    char path[4200], identity[64];
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        snprintf(problem, size, "cannot become a subreaper: %s", strerror(errno));
        return -1;
    }
    snprintf(identity, sizeof identity, "%d %lld\n", s->me, start_time(s->me));
    snprintf(path, sizeof path, "%s/supervisor.pid.tmp", s->job_dir);
    char final[4200];
    snprintf(final, sizeof final, "%s/supervisor.pid", s->job_dir);
    if (write_file(path, identity, strlen(identity), 0600, 0, 0, 0) != 0 || rename(path, final) != 0) {
        snprintf(problem, size, "cannot write supervisor.pid: %s", strerror(errno));
        return -1;
    }
    buf spec_text = {0};
    const char *bad = NULL;
    snprintf(path, sizeof path, "%s/spec.json", s->job_dir);
    if (read_file(path, &spec_text) != 0) {
        snprintf(problem, size, "cannot read spec.json: %s", strerror(errno));
        return -1;
    }
    if (read_spec(s, spec_text.data, spec_text.len, &bad) != 0) {
        snprintf(problem, size, "%s", bad);
        return -1;
    }
    snprintf(script, script_size, "%s/script", s->job_dir);
    s->spec.argv[0] = script;
    if (write_file(script, s->spec.script, s->spec.script_len, 0700, s->spec.has_uid, s->spec.uid, s->spec.has_gid ? s->spec.gid : (gid_t)-1) != 0) {
        snprintf(problem, size, "cannot write the script: %s", strerror(errno));
        return -1;
    }
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(problem, size, "cannot create a pipe: %s", strerror(errno));
        return -1;
    }
    s->wake_r = pipe_fds[0];
    s->wake_w = wake_fd = pipe_fds[1];
    /* installed before the job starts, so that no exit is missed */
    struct sigaction wake = {.sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &wake, NULL);
    return 0;
}

/* job.pid: "<job pid> <its start time> <how it was made>\n" and a line per cgroup folder of
 * the job, for the agent: when this supervisor dies (even by SIGKILL) the agent stops the job's
 * process group and cgroups itself, so that nothing of the job outlives its supervisor
 * (gpuq/agent/jobs/orphan_reaper.py, stop_job_processes). How: make_child's word ("clone3": born
 * in its v2 group). */
static void record_job(supervisor *s) {
    char path[4200];
    const char *folders[CG_ROLES];
    buf text = {0};
    snprintf(path, sizeof path, "%s/job.pid", s->job_dir);
    buf_addf(&text, "%d %lld %s\n", s->job_pid, start_time(s->job_pid), s->spawned_by);
    int n = cgroup_folders(&s->group, folders);
    for (int i = 0; i < n; i++) buf_addf(&text, "%s\n", folders[i]);
    (void)write_file(path, text.data, text.len, 0600, 0, 0, 0);
    free(text.data);
}

/* The device rules in the job's devices group; 1 when applied (the job must then join it). */
static int isolate_devices(supervisor *s) {
    const launch_spec *spec = &s->spec;
    const char *how = "";
    char why[512];
    if (spec->ndeny == 0) {
        snprintf(s->isolation, sizeof s->isolation, "none: no device to deny");
        return 0;
    }
    if (cgroup_deny_devices(&s->group, spec->deny, spec->ndeny, &how, why, sizeof why) != 0) {
        snprintf(s->isolation, sizeof s->isolation, "advisory: %s", why);
        return 0;
    }
    snprintf(s->isolation, sizeof s->isolation, "%s", how);
    return 1;
}

static int parse_cpulist(const char *text, cpu_set_t *out) {
    CPU_ZERO(out);
    for (const char *p = text; *p;) {
        char *end;
        long first = strtol(p, &end, 10), last = first;
        if (end == p) return -1;
        if (*end == '-') {
            p = end + 1;
            last = strtol(p, &end, 10);
            if (end == p) return -1;
        }
        if (first < 0 || last < first || last >= CPU_SETSIZE) return -1;
        for (long cpu = first; cpu <= last; cpu++) CPU_SET((int)cpu, out);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return 0;
}

/* The job's CPUs: its cpuset group where there is one, else the child's affinity (which
 * cannot bind memory nodes); 1 when the group binds them (the job must then join it). */
static int bind_cpus(supervisor *s) {
    const launch_spec *spec = &s->spec;
    cpu_set_t allowed;
    if (spec->cpuset == NULL) {
        snprintf(s->cpu_binding, sizeof s->cpu_binding, "none");
        return 0;
    }
    if (cgroup_bind_cpus(&s->group, spec->cpuset, spec->mems) == 0) {
        snprintf(s->cpu_binding, sizeof s->cpu_binding, "cpuset cgroup v%d: %.200s", s->group.cpuset_version, spec->cpuset);
        return 1;
    }
    if (parse_cpulist(spec->cpuset, &s->affinity) != 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        snprintf(s->cpu_binding, sizeof s->cpu_binding, "advisory: cannot bind CPUs %.200s", spec->cpuset);
        return 0;
    }
    CPU_AND(&allowed, &allowed, &s->affinity);
    if (CPU_COUNT(&allowed) == 0) { /* none of them is ours to give: the job runs unbound */
        snprintf(s->cpu_binding, sizeof s->cpu_binding, "advisory: CPUs %.200s are not available here", spec->cpuset);
        return 0;
    }
    s->use_affinity = 1;
    snprintf(s->cpu_binding, sizeof s->cpu_binding, "sched_setaffinity: %.200s", spec->cpuset);
    return 0;
}

static void write_isolation(supervisor *s) {
    char path[4200], text[700];
    snprintf(path, sizeof path, "%s/isolation", s->job_dir);
    int n = snprintf(text, sizeof text, "%s\n", s->isolation);
    if (n > 0 && n < (int)sizeof text) (void)write_file(path, text, (size_t)n, 0600, 0, 0, 0);
}

/* Where the child joins each of the job's groups (cgroup_open_join), and which it must join;
 * the v2 group's folder instead, for the child to be born in (its cgroup.procs is opened only
 * if that fails: make_child). */
static void open_joins(supervisor *s, child_args *joins, int devices_required, int cpus_required) {
    const char *folders[CG_ROLES];
    joins->ncgroups = cgroup_folders(&s->group, folders);
    joins->v2_dir = cgroup_open_v2(&s->group, &joins->v2_folder);
    joins->v2_index = -1;
    for (int i = 0; i < joins->ncgroups; i++) {
        if (joins->v2_folder != NULL && strcmp(folders[i], joins->v2_folder) == 0) joins->v2_index = i;
        joins->cgroup_fds[i] = i == joins->v2_index ? -1 : cgroup_open_join(folders[i]);
        joins->cgroup_required[i] = (s->group_limited && strcmp(folders[i], s->group.path) == 0)
                                    || (devices_required && strcmp(folders[i], s->group.devices) == 0)
                                    || (cpus_required && strcmp(folders[i], s->group.cpuset) == 0);
    }
    joins->affinity = s->use_affinity ? &s->affinity : NULL;
}

/* ---- an interactive job's terminal ---- */

/* The slave's modes and size as the spec says, and its owner the job's user (as a login's
 * terminal is: group tty, 0620), so that the job may open /dev/tty and its pts again. */
static int set_up_slave(supervisor *s, int slave) {
    const launch_spec *spec = &s->spec;
    struct termios mode;
    if (tcgetattr(slave, &mode) != 0) return -1;
    mode.c_iflag |= IUTF8;
    if (!spec->stdin_tty) mode.c_lflag &= ~(tcflag_t)(ECHO | ECHONL); /* piped input is not echoed */
    if (!spec->stdout_tty) mode.c_oflag &= ~(tcflag_t)OPOST; /* piped output keeps its bare \n */
    if (tcsetattr(slave, TCSANOW, &mode) != 0) return -1;
    struct winsize size = {.ws_row = (unsigned short)spec->rows, .ws_col = (unsigned short)spec->cols};
    if (spec->rows && spec->cols && ioctl(slave, TIOCSWINSZ, &size) != 0) return -1;
    if (spec->has_uid) {
        struct group *tty = getgrnam("tty");
        gid_t gid = tty ? tty->gr_gid : spec->gid;
        if (fchown(slave, spec->uid, gid) != 0 || fchmod(slave, tty ? 0620 : 0600) != 0) return -1;
    }
    return 0;
}

/* pty.sock in the job folder, 0600 (the folder may be passable by the job's user). The path
 * is bound relative to the folder: a long folder name must not exceed sun_path. */
static int listen_terminal(supervisor *s) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    snprintf(address.sun_path, sizeof address.sun_path, "%s", PTY_SOCKET);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (chdir(s->job_dir) != 0) { close(fd); return -1; }
    unlink(PTY_SOCKET);
    mode_t old = umask(0177); /* one thread: the umask is this process's alone */
    int ok = bind(fd, (struct sockaddr *)&address, sizeof address) == 0;
    umask(old);
    int saved = errno;
    if (chdir("/") != 0) { /* hold no folder busy */
    }
    errno = saved;
    if (!ok || listen(fd, 8) != 0) { saved = errno; close(fd); errno = saved; return -1; }
    s->pty_listen = fd;
    return 0;
}

/* The terminal of an interactive job, before it starts; 0, or -1 with the launch error set. */
static int open_terminal(supervisor *s) {
    char name[128];
    const char *what = "open a pseudo-terminal";
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC), slave = -1;
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0 || ptsname_r(master, name, sizeof name) != 0) goto fail;
    /* O_NOCTTY: the supervisor leads a session of its own, and must not take the terminal */
    if ((slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) goto fail;
    what = "set up the terminal";
    if (set_up_slave(s, slave) != 0) goto fail;
    what = "serve the terminal on " PTY_SOCKET;
    if (listen_terminal(s) != 0) goto fail;
    s->pty_master = master;
    s->pty_slave = slave;
    return 0;
fail:
    snprintf(s->launch_error, sizeof s->launch_error, "launch failed: cannot %s: %s", what, strerror(errno));
    if (slave >= 0) close(slave);
    if (master >= 0) close(master);
    return -1;
}

/* Everyone waiting on pty.sock: the agent's user (this process's euid) gets the master. */
static void on_terminal_client(supervisor *s) {
    for (;;) {
        int client = accept4(s->pty_listen, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) return; /* none left (EAGAIN), or nothing to do about it */
        struct ucred peer;
        socklen_t len = sizeof peer;
        char answer = 'N';
        struct iovec data = {&answer, 1};
        union {
            struct cmsghdr align;
            char space[CMSG_SPACE(sizeof(int))];
        } control;
        memset(&control, 0, sizeof control);
        struct msghdr message = {.msg_iov = &data, .msg_iovlen = 1};
        if (getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.uid == geteuid()) {
            answer = 'T';
            message.msg_control = control.space;
            message.msg_controllen = sizeof control.space;
            struct cmsghdr *header = CMSG_FIRSTHDR(&message);
            header->cmsg_level = SOL_SOCKET;
            header->cmsg_type = SCM_RIGHTS;
            header->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(header), &s->pty_master, sizeof(int));
        }
        /* a fresh connection's buffer takes one byte at once: this never blocks */
        (void)sendmsg(client, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
        close(client);
    }
}

static void start(supervisor *s, const char *script) {
    const launch_spec *spec = &s->spec;
    /* every job gets groups of its own where they can be made, so that the end (or the agent,
     * when this supervisor is gone) finds every process of the job, even one that escaped with
     * setsid; the memory group enforces --mem unless the admin asked for polling or no limit
     * could be set */
    if (spec->has_mem_limit && !spec->mem_poll_only)
        s->group_limited = cgroup_create(&s->group, spec->job_id, &spec->place, spec->mem_limit) == 0;
    if (s->group.version == 0) cgroup_create(&s->group, spec->job_id, &spec->place, -1);
    cgroup_create_others(&s->group, spec->job_id, &spec->place);
    s->polling = spec->has_mem_limit && !s->group_limited;
    child_args joins;
    memset(&joins, 0, sizeof joins);
    int devices_required = isolate_devices(s);
    int cpus_required = bind_cpus(s);
    open_joins(s, &joins, devices_required, cpus_required);
    write_isolation(s);
    s->started_at = wall_time();
    if (!spec->has_terminal || open_terminal(s) == 0) spawn_job(s, script, &joins);
    if (s->pty_slave >= 0) { /* the job's now: its last close is the terminal's end (EIO) */
        close(s->pty_slave);
        s->pty_slave = -1;
    }
    for (int i = 0; i < joins.ncgroups; i++)
        if (joins.cgroup_fds[i] >= 0) close(joins.cgroup_fds[i]);
    if (joins.v2_dir >= 0) close(joins.v2_dir);
    if (s->launch_error[0]) {
        if (s->job_pid > 0) {
            int status;
            while (waitpid(s->job_pid, &status, 0) < 0 && errno == EINTR) {
            }
        }
        s->main_gone = 1;
        return;
    }
    record_job(s);
    double now = monotonic();
    if (spec->has_time_limit) {
        /* --signal SIG@S: SIG S seconds before the limit, or soon after start when S is not
         * shorter than the limit (SLURM: as soon as it can); then SIGTERM at the limit */
        double limit = spec->time_limit, warn = spec->warning_seconds;
        if (warn > 0) set_timer(s, T_WARN, now + (warn < limit ? limit - warn : fmin(WARN_EARLIEST, limit)));
        set_timer(s, T_LIMIT, now + limit);
    }
    if (s->polling) set_timer(s, T_MEM, now);
    if (spec->has_lease) set_timer(s, T_FENCE, spec->lease_until);
}

/* Run every due timer, earliest first; 1 when the supervisor should exit without an ack. */
static int run_timers(supervisor *s) {
    for (;;) {
        int next = -1;
        double now = monotonic();
        for (int i = 0; i < T_COUNT; i++)
            if (s->timer_set[i] && s->timers[i] <= now && (next < 0 || s->timers[i] < s->timers[next])) next = i;
        if (next < 0) return 0;
        s->timer_set[next] = 0;
        switch (next) {
        case T_GIVE_UP: return 1;
        case T_WARN: signal_job(s, s->spec.warning_signal); break;
        case T_LIMIT: on_limit(s); break;
        case T_KILL: on_kill(s); break;
        case T_MEM: on_mem(s); break;
        case T_CONNECT: link_connect(s); break;
        case T_FENCE: on_fence(s); break;
        }
    }
}

static void run(supervisor *s, const char *script) {
    start(s, script);
    if (s->main_gone) finish(s); /* a launch failure: the first hello already carries the result */
    link_connect(s);
    while (!s->acked) {
        if (s->result == NULL) {
            reap(s);
            if (s->main_gone) { finish(s); continue; }
        }
        int timeout = -1;
        double now = monotonic();
        for (int i = 0; i < T_COUNT; i++) {
            if (!s->timer_set[i]) continue;
            double wait = s->timers[i] - now;
            int ms = wait <= 0 ? 0 : (int)fmin(wait * 1000 + 1, 1e9);
            if (timeout < 0 || ms < timeout) timeout = ms;
        }
        /* wake, the terminal's socket (always there when the job has one), the agent link */
        struct pollfd fds[3] = {{s->wake_r, POLLIN, 0}, {s->pty_listen, POLLIN, 0}, {s->sock, (short)(POLLIN | (s->out.len ? POLLOUT : 0)), 0}};
        int link = s->sock >= 0;
        int n = poll(fds, 3, timeout); /* a negative fd is skipped */
        if (n > 0) {
            if (fds[0].revents) drain(s->wake_r);
            if (fds[1].revents) on_terminal_client(s);
            if (link && s->sock >= 0 && fds[2].revents) on_link(s, fds[2].revents);
        }
        if (run_timers(s)) return;
    }
}

static void crash_result(supervisor *s, const char *problem) {
    /* the supervisor cannot go on: the job must not run unsupervised, and its end must not be
     * lost; the agent finds this result when it sees the supervisor gone */
    if (s->job_pid > 0) signal_tree(s->me, s->job_pid, SIGKILL, NULL);
    const char *name = strrchr(s->job_dir, '/');
    long long job_id = s->have_spec ? s->spec.job_id : strtoll(name ? name + 1 : s->job_dir, NULL, 10);
    double now = wall_time();
    char reason[600];
    snprintf(reason, sizeof reason, "supervisor error: %s", problem);
    job_end end = {job_id, "failed", 0, 0, reason, s->started_at ? s->started_at : now, now, 0, 0, s->isolation, s->cpu_binding};
    save_result(s->job_dir, result_json(&end));
    fprintf(stderr, "gpuq supervisor %s: %s\n", s->job_dir, reason);
}

/* `ps -e`, `top` and `pgrep` show the supervisor as "gpuq-job N" (its comm: 15 bytes at most,
 * so "gpuq N" for a longer id, never an id cut short); its command line stays the fork
 * server's, which is how the agent finds its supervisors again */
static void name_process(long long job_id) {
    char name[32];
    snprintf(name, sizeof name, "gpuq-job %lld", job_id);
    if (strlen(name) > 15) snprintf(name, sizeof name, "gpuq %lld", job_id);
    if (strlen(name) <= 15) prctl(PR_SET_NAME, name, 0, 0, 0);
}

int supervise(const char *job_dir, double ack_wait) {
    static supervisor s;
    static char script[4200];
    char problem[512] = "";
    memset(&s, 0, sizeof s);
    s.job_dir = job_dir;
    s.ack_wait = ack_wait;
    s.me = getpid();
    s.sock = s.wake_r = s.wake_w = -1;
    s.pty_master = s.pty_slave = s.pty_listen = -1;
    s.tree_signalled = -1e9;
    if (chdir("/") != 0) { /* hold no folder busy; every path here is absolute */
    }
    if (prepare(&s, script, sizeof script, problem, sizeof problem) != 0) {
        crash_result(&s, problem);
        return 1;
    }
    name_process(s.spec.job_id);
    run(&s, script);
    if (s.acked) remove_job_dir(job_dir);
    return 0;
}
