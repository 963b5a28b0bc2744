/* The job's processes, found below the supervisor, which is a child subreaper (what SLURM's
 * proctrack plugin does, for one job); the job's cgroups are cgroups.c's.
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/bpf.h>

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

void parse_pids(const char *text, pidlist *out) {
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
