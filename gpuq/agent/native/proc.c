/* The job's processes (found below the supervisor, which is a child subreaper) and its own
 * cgroup (v2 or v1). These mirror what SLURM's proctrack and task/cgroup plugins do, for one job.
 *
 * Walking /proc/<pid>/task/<tid>/children from the supervisor finds the whole job, even
 * processes that left its process group: orphans re-parent to the subreaper, not to init. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "supervise.h"

#define PF_EXITING 0x4 /* task flag (stat field 9): the process is in exit */

void pids_add(pidlist *list, pid_t pid) {
    if (list->n == list->cap) {
        list->cap = list->cap ? list->cap * 2 : 16;
        list->pids = realloc(list->pids, list->cap * sizeof *list->pids);
        if (list->pids == NULL) abort();
    }
    list->pids[list->n++] = pid;
}

int pids_has(const pidlist *list, pid_t pid) {
    for (size_t i = 0; i < list->n; i++)
        if (list->pids[i] == pid) return 1;
    return 0;
}

void pids_clear(pidlist *list) { list->n = 0; }

int read_file(const char *path, buf *out) {
    out->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char chunk[4096];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) { int saved = errno; close(fd); errno = saved; return -1; }
        if (n == 0) break;
        buf_add(out, chunk, (size_t)n);
    }
    close(fd);
    buf_add(out, "", 0); /* NUL-terminated even when empty */
    return 0;
}

static void parse_pids(const char *text, pidlist *out) {
    const char *p = text;
    while (*p) {
        char *end;
        long value = strtol(p, &end, 10);
        if (end == p) { p++; continue; }
        if (value > 0) pids_add(out, (pid_t)value);
        p = end;
    }
}

/* Children of every thread of `pid`; one read when it has one thread (the supervisor). */
static void children_of(pid_t pid, int single_thread, pidlist *out) {
    static buf text;
    char path[320];
    if (single_thread) {
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
        if (read_file(path, &text) == 0) parse_pids(text.data, out);
        return;
    }
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *dir = opendir(path);
    if (dir == NULL) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%d/task/%s/children", pid, entry->d_name);
        if (read_file(path, &text) == 0) parse_pids(text.data, out);
    }
    closedir(dir);
}

void descendants(pid_t root, pidlist *out) {
    pidlist stack = {0};
    pids_clear(out);
    children_of(root, 1, &stack);
    while (stack.n > 0) {
        pid_t pid = stack.pids[--stack.n];
        pids_add(out, pid);
        children_of(pid, 0, &stack);
    }
    free(stack.pids);
}

/* Fields of /proc/<pid>/stat after the command name; field 3 (state) is fields[0]. */
static int stat_fields(pid_t pid, char *fields[], int wanted) {
    static buf text;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (read_file(path, &text) != 0 || text.len == 0) return 0;
    char *p = strrchr(text.data, ')');
    if (p == NULL) return 0;
    p++;
    int n = 0;
    char *save;
    for (char *word = strtok_r(p, " \n", &save); word && n < wanted; word = strtok_r(NULL, " \n", &save))
        fields[n++] = word;
    return n;
}

int has_exited(pid_t pid) {
    char *fields[8];
    if (stat_fields(pid, fields, 8) < 7) return 1;
    char state = fields[0][0];
    return state == 'Z' || state == 'X' || state == 'x' || (strtoul(fields[6], NULL, 10) & PF_EXITING);
}

long long start_time(pid_t pid) {
    char *fields[20];
    if (stat_fields(pid, fields, 20) < 20) return -1;
    return strtoll(fields[19], NULL, 10);
}

int group_alive(pid_t pgid) {
    if (pgid <= 0) return 0;
    return kill(-pgid, 0) == 0 || errno == EPERM;
}

void signal_tree(pid_t root, pid_t pgid, int sig, const pidlist *extra) {
    /* the group atomically (no child forked meanwhile misses it); the rest once each by pid */
    if (pgid > 0) kill(-pgid, sig); /* never 0: that would be the supervisor's own group */
    pidlist all = {0};
    descendants(root, &all);
    if (extra != NULL)
        for (size_t i = 0; i < extra->n; i++)
            if (!pids_has(&all, extra->pids[i])) pids_add(&all, extra->pids[i]);
    for (size_t i = 0; i < all.n; i++) {
        pid_t group = getpgid(all.pids[i]);
        if (group < 0 || group == pgid) continue;
        kill(all.pids[i], sig);
    }
    free(all.pids);
}

long long tree_rss(const pidlist *pids) {
    /* statm resident pages; shared pages count twice, as with SLURM's jobacct_gather/linux */
    static buf text;
    long long pages = 0;
    char path[64];
    for (size_t i = 0; i < pids->n; i++) {
        snprintf(path, sizeof path, "/proc/%d/statm", pids->pids[i]);
        long long size, resident;
        if (read_file(path, &text) == 0 && sscanf(text.data, "%lld %lld", &size, &resident) == 2)
            pages += resident;
    }
    return pages * sysconf(_SC_PAGESIZE);
}

void signal_name(int sig, char *out, size_t size) {
    static const char *const names[] = {
        NULL, "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV",
        "USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU",
        "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS",
    };
    if (sig > 0 && sig < (int)(sizeof names / sizeof *names)) snprintf(out, size, "SIG%s", names[sig]);
    else if (sig == SIGRTMIN) snprintf(out, size, "SIGRTMIN");
    else if (sig == SIGRTMAX) snprintf(out, size, "SIGRTMAX");
    else snprintf(out, size, "signal %d", sig);
}

/* ---- the job's cgroup (in the memory controller's hierarchy) ---- */

static char hierarchy[4096];
static int hierarchy_version;

static int has_v2_memory(const char *mount_point) {
    buf text = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.controllers", mount_point);
    int found = 0;
    if (read_file(path, &text) == 0) {
        for (char *save, *word = strtok_r(text.data, " \n", &save); word; word = strtok_r(NULL, " \n", &save))
            if (strcmp(word, "memory") == 0) found = 1;
    }
    free(text.data);
    return found;
}

void cgroup_detect(void) {
    /* the hierarchy with the memory controller, v2 preferred */
    FILE *mounts = fopen("/proc/self/mounts", "re");
    char line[8192], v1[4096] = "";
    if (mounts == NULL) return;
    while (fgets(line, sizeof line, mounts)) {
        char source[4096], point[4096], fstype[64], options[4096];
        if (sscanf(line, "%4095s %4095s %63s %4095s", source, point, fstype, options) != 4) continue;
        if (strcmp(fstype, "cgroup2") == 0 && has_v2_memory(point)) {
            snprintf(hierarchy, sizeof hierarchy, "%s", point);
            hierarchy_version = 2;
            fclose(mounts);
            return;
        }
        if (strcmp(fstype, "cgroup") == 0) {
            for (char *save, *opt = strtok_r(options, ",", &save); opt; opt = strtok_r(NULL, ",", &save))
                if (strcmp(opt, "memory") == 0) snprintf(v1, sizeof v1, "%s", point);
        }
    }
    fclose(mounts);
    if (v1[0]) {
        snprintf(hierarchy, sizeof hierarchy, "%s", v1);
        hierarchy_version = 1;
    }
}

static int write_text(const char *dir, const char *name, const char *value) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, value, strlen(value));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(value) ? 0 : -1;
}

static int mkdirs(const char *path) {
    char partial[4096];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *p = partial + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(partial, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(partial, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int cgroup_create(cgroup *group, long long job_id, const char *parent, long long limit) {
    /* <hierarchy>/<parent or gpuq>/job_<id>, limited to `limit` bytes (limit < 0: no limit, the
     * group only holds the job's processes so that none escapes the end); -1: none made */
    char parent_path[4096], limit_text[32];
    if (geteuid() != 0 || hierarchy_version == 0) return -1;
    const char *rel = parent && parent[0] ? parent : "gpuq";
    while (*rel == '/') rel++;
    if (snprintf(parent_path, sizeof parent_path, "%s/%s", hierarchy, rel) >= (int)sizeof parent_path - 48)
        return -1;
    size_t len = strlen(parent_path);
    while (len > 0 && parent_path[len - 1] == '/') parent_path[--len] = '\0';
    snprintf(group->path, sizeof group->path, "%s/job_%lld", parent_path, job_id);
    /* v1, the parent there (every job but the first): straight to the job's group, which saves
     * the parent's mkdir calls (v2 turns the memory controller on down to the parent first) */
    int made = hierarchy_version == 1 && mkdir(group->path, 0755) == 0;
    if (!made && mkdirs(parent_path) != 0) return -1;
    if (hierarchy_version == 2) {
        /* turn the memory controller on for the children of every level down to the parent */
        char level[4096];
        snprintf(level, sizeof level, "%s", hierarchy);
        write_text(level, "cgroup.subtree_control", "+memory");
        for (const char *p = parent_path + strlen(hierarchy); *p; p++) {
            if (*p == '/' && p != parent_path + strlen(hierarchy)) {
                snprintf(level, sizeof level, "%.*s", (int)(p - parent_path), parent_path);
                write_text(level, "cgroup.subtree_control", "+memory");
            }
        }
        write_text(parent_path, "cgroup.subtree_control", "+memory");
    }
    if (!made) rmdir(group->path); /* an empty leftover of an earlier run of this job */
    if (!made && mkdir(group->path, 0755) != 0) {
        /* still busy (an earlier start of this job not yet gone, or another agent's job with
         * this id): never share it, its end would kill this job; a name of this start's own */
        if (errno != EEXIST) return -1;
        snprintf(group->path, sizeof group->path, "%s/job_%lld.%d", parent_path, job_id, (int)getpid());
        rmdir(group->path);
        if (mkdir(group->path, 0755) != 0) return -1;
    }
    group->version = hierarchy_version;
    if (limit < 0) return 0; /* a new group is unlimited: memory.max "max", v1 no limit */
    snprintf(limit_text, sizeof limit_text, "%lld", limit);
    int failed;
    if (group->version == 2) {
        failed = write_text(group->path, "memory.max", limit_text);
        /* no swap: the limit means RAM, as SLURM's --mem does, and an OOM is not a slow crawl */
        if (!failed) write_text(group->path, "memory.swap.max", "0");
    } else {
        failed = write_text(group->path, "memory.limit_in_bytes", limit_text);
        if (!failed) write_text(group->path, "memory.memsw.limit_in_bytes", limit_text);
    }
    if (failed) {
        rmdir(group->path);
        group->version = 0;
        return -1;
    }
    return 0;
}

int cgroup_open_procs(const cgroup *group) {
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.procs", group->path);
    return open(path, O_WRONLY | O_CLOEXEC);
}

void cgroup_pids(const cgroup *group, pidlist *out) {
    static buf text;
    char path[4200];
    pids_clear(out);
    if (group->version == 0) return;
    snprintf(path, sizeof path, "%s/cgroup.procs", group->path);
    if (read_file(path, &text) == 0) parse_pids(text.data, out);
}

long long cgroup_oom_kills(const cgroup *group) {
    buf text = {0};
    char path[4200];
    long long kills = 0;
    snprintf(path, sizeof path, "%s/%s", group->path, group->version == 2 ? "memory.events" : "memory.oom_control");
    if (read_file(path, &text) == 0) {
        for (char *save, *line = strtok_r(text.data, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
            if (strncmp(line, "oom_kill ", 9) == 0) kills = strtoll(line + 9, NULL, 10);
    }
    free(text.data);
    return kills;
}

long long cgroup_peak(const cgroup *group) {
    buf text = {0};
    char path[4200];
    long long peak = 0;
    snprintf(path, sizeof path, "%s/%s", group->path, group->version == 2 ? "memory.peak" : "memory.max_usage_in_bytes");
    if (read_file(path, &text) == 0) peak = strtoll(text.data, NULL, 10);
    free(text.data);
    return peak;
}

void cgroup_remove(const cgroup *group) {
    /* retried briefly: the kernel frees the group just after its last process exits */
    struct timespec pause = {0, 10 * 1000 * 1000};
    for (int attempt = 0; attempt < 200; attempt++) {
        if (rmdir(group->path) == 0 || errno == ENOENT) return;
        nanosleep(&pause, NULL);
    }
}
