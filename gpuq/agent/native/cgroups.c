/* The job's own cgroups (v2 or v1): memory, devices (its GPU rules) and cpuset (its CPUs), as
 * SLURM's task/cgroup plugin makes them, for one job. */
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

/* ---- the job's cgroups ----
 *
 * One group per hierarchy, all at <mount>/<parent or gpuq>/job_<id>: the memory group (limits,
 * OOM kills, peak), the devices group (the job's GPU rules) and the cpuset group (its CPUs).
 * On cgroup v2 they are one group; on v1 (or a hybrid machine) one per controller. */

typedef struct {
    char mount[4096]; /* "" when the machine has none for this role */
    int version;
} hierarchy;

static hierarchy roles[CG_ROLES];
static int v2_pids; /* the v2 mount offers the pids controller (a job gets pids.max there) */
/* TEST ONLY: GPUQ_TEST_CGROUP_V2=<folder> takes a plain folder for a v2 mount (a fake tree
 * whose cgroup.controllers names what it offers): the supervisor creates the files it writes,
 * so that tests read what a job's v2 group got on a machine whose memory controller is v1's */
static int fake_v2;
/* TEST ONLY: GPUQ_TEST_CLONE3=refuse gives clone3 a folder that is no cgroup ("/"), so that the
 * kernel refuses (EBADF) and a job's child falls back to vfork and joining by writing */
static int refuse_clone3;

static int v2_has(const char *mount_point, const char *controller) {
    buf text = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.controllers", mount_point);
    int found = 0;
    if (read_file(path, &text) == 0) {
        for (char *save, *word = strtok_r(text.data, " \n", &save); word; word = strtok_r(NULL, " \n", &save))
            if (strcmp(word, controller) == 0) found = 1;
    }
    free(text.data);
    return found;
}

static void set_role(int role, const char *mount, int version) {
    snprintf(roles[role].mount, sizeof roles[role].mount, "%s", mount);
    roles[role].version = version;
}

void cgroup_detect(void) {
    /* memory and cpuset: v2 where its root offers the controller, else v1's hierarchy. Devices:
     * v1's controller, else a v2 device program (which needs no controller: the kernel runs it
     * for a task's v2 group even on a hybrid machine). GPUQ_DEVICE_CGROUP=v2 prefers the
     * program where both exist (tests; an admin who wants the v2 way on a hybrid machine). */
    FILE *mounts = fopen("/proc/self/mounts", "re");
    char line[8192], v2[4096] = "", v1_memory[4096] = "", v1_devices[4096] = "", v1_cpuset[4096] = "";
    if (mounts == NULL) return;
    while (fgets(line, sizeof line, mounts)) {
        char source[4096], point[4096], fstype[64], options[4096];
        if (sscanf(line, "%4095s %4095s %63s %4095s", source, point, fstype, options) != 4) continue;
        if (strcmp(fstype, "cgroup2") == 0 && !v2[0]) snprintf(v2, sizeof v2, "%s", point);
        if (strcmp(fstype, "cgroup") != 0) continue;
        for (char *save, *opt = strtok_r(options, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
            if (strcmp(opt, "memory") == 0) snprintf(v1_memory, sizeof v1_memory, "%s", point);
            if (strcmp(opt, "devices") == 0) snprintf(v1_devices, sizeof v1_devices, "%s", point);
            if (strcmp(opt, "cpuset") == 0) snprintf(v1_cpuset, sizeof v1_cpuset, "%s", point);
        }
    }
    fclose(mounts);
    const char *refuse = getenv("GPUQ_TEST_CLONE3");
    refuse_clone3 = refuse && strcmp(refuse, "refuse") == 0;
    const char *fake = getenv("GPUQ_TEST_CGROUP_V2");
    if (fake && fake[0]) {
        snprintf(v2, sizeof v2, "%s", fake);
        v1_memory[0] = v1_cpuset[0] = '\0';
        fake_v2 = 1;
    }
    v2_pids = v2[0] && v2_has(v2, "pids");
    if (v2[0] && v2_has(v2, "memory")) set_role(CG_MEMORY, v2, 2);
    else if (v1_memory[0]) set_role(CG_MEMORY, v1_memory, 1);
    const char *prefer = getenv("GPUQ_DEVICE_CGROUP");
    if (v1_devices[0] && !(v2[0] && prefer && strcmp(prefer, "v2") == 0)) set_role(CG_DEVICES, v1_devices, 1);
    else if (v2[0]) set_role(CG_DEVICES, v2, 2);
    if (v2[0] && v2_has(v2, "cpuset")) set_role(CG_CPUSET, v2, 2);
    else if (v1_cpuset[0]) set_role(CG_CPUSET, v1_cpuset, 1);
}

static int write_text(const char *dir, const char *name, const char *value) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC | (fake_v2 ? O_CREAT : 0), 0644);
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

/* v2: turn `controllers` on for the children of every level from the delegated subtree (else
 * the mount) down to `parent` (a controller the machine lacks fails alone and is left off).
 * Never above the delegated subtree: systemd owns those levels and forbids writes there. */
static void v2_enable(const char *mount, const char *delegated, const char *parent, const char *const *controllers) {
    char level[4096];
    size_t root = strlen(mount);
    if (delegated && delegated[0]) {
        while (*delegated == '/') delegated++;
        size_t len = strlen(delegated);
        while (len > 0 && delegated[len - 1] == '/') len--;
        /* only where `parent` is inside it: <mount>/<delegated>[/...] */
        if (strncmp(parent + root, "/", 1) == 0 && strncmp(parent + root + 1, delegated, len) == 0
            && (parent[root + 1 + len] == '/' || parent[root + 1 + len] == '\0'))
            root += 1 + len;
    }
    for (size_t end = root; ; end++) {
        if (parent[end] != '/' && parent[end] != '\0') continue;
        snprintf(level, sizeof level, "%.*s", (int)end, parent);
        for (const char *const *c = controllers; *c; c++) write_text(level, "cgroup.subtree_control", *c);
        if (parent[end] == '\0') return;
    }
}

/* v1 cpuset: a group takes no task until its cpus and mems are set, and a new group starts
 * empty; fill every empty level down to `parent` from the one above it, and have the kernel
 * copy the parent's into each job's group as it is made (clone_children), which saves every
 * job two reads and two writes */
static void v1_cpuset_fill(const char *mount, const char *parent) {
    buf cpus = {0}, mems = {0};
    char level[4096], above[4096];
    size_t root = strlen(mount);
    snprintf(above, sizeof above, "%s", mount);
    for (size_t end = root + 1; end <= strlen(parent); end++) {
        if (parent[end] != '/' && parent[end] != '\0') continue;
        snprintf(level, sizeof level, "%.*s", (int)end, parent);
        char path[4200];
        snprintf(path, sizeof path, "%s/cpuset.cpus", level);
        if (read_file(path, &cpus) == 0 && cpus.len > 0 && cpus.data[0] == '\n') {
            snprintf(path, sizeof path, "%s/cpuset.cpus", above);
            if (read_file(path, &cpus) == 0) write_text(level, "cpuset.cpus", cpus.data);
            snprintf(path, sizeof path, "%s/cpuset.mems", above);
            if (read_file(path, &mems) == 0) write_text(level, "cpuset.mems", mems.data);
        }
        snprintf(above, sizeof above, "%s", level);
    }
    write_text(parent, "cgroup.clone_children", "1");
    free(cpus.data);
    free(mems.data);
}

static int v1_cpuset_empty(const char *folder) {
    buf text = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/cpuset.mems", folder);
    int empty = read_file(path, &text) != 0 || text.len == 0 || text.data[0] == '\n';
    free(text.data);
    return empty;
}

/* <mount>/<parent or gpuq>/job_<id> into `out`; 0, or -1 (nothing made) */
static int make_group(const hierarchy *h, long long job_id, const cgroup_place *where, char *out, size_t size) {
    char parent_path[4096];
    const char *parent = where->parent;
    const char *rel = parent && parent[0] ? parent : "gpuq";
    while (*rel == '/') rel++;
    if (snprintf(parent_path, sizeof parent_path, "%s/%s", h->mount, rel) >= (int)sizeof parent_path - 48)
        return -1;
    size_t len = strlen(parent_path);
    while (len > 0 && parent_path[len - 1] == '/') parent_path[--len] = '\0';
    snprintf(out, size, "%s/job_%lld", parent_path, job_id);
    /* v1, the parent there (every job but the first): straight to the job's group, which saves
     * the parent's mkdir calls (v2 turns the controllers on down to the parent first) */
    int made = h->version == 1 && mkdir(out, 0755) == 0;
    if (!made && mkdirs(parent_path) != 0) return -1;
    if (h->version == 2) {
        const char *wanted[4];
        int n = 0;
        if (strcmp(roles[CG_MEMORY].mount, h->mount) == 0) wanted[n++] = "+memory";
        if (v2_pids && where->max_pids > 0) wanted[n++] = "+pids";
        if (strcmp(roles[CG_CPUSET].mount, h->mount) == 0) wanted[n++] = "+cpuset";
        wanted[n] = NULL;
        if (n) v2_enable(h->mount, where->delegated, parent_path, wanted);
    } else if (!made && h == &roles[CG_CPUSET]) {
        v1_cpuset_fill(h->mount, parent_path);
    }
    if (!made) rmdir(out); /* an empty leftover of an earlier run of this job */
    if (!made && mkdir(out, 0755) != 0) {
        /* still busy (an earlier start of this job not yet gone, or another agent's job with
         * this id): never share it, its end would kill this job; a name of this start's own */
        if (errno != EEXIST) return -1;
        snprintf(out, size, "%s/job_%lld.%d", parent_path, job_id, (int)getpid());
        rmdir(out);
        if (mkdir(out, 0755) != 0) return -1;
    }
    return 0;
}

/* v2, every job's group: an OOM kills the whole job (memory.oom.group), not one process of it
 * that a framework then waits on forever; pids.max stops a fork bomb before it takes the
 * node's pid space (its forks fail with EAGAIN). Best effort: a kernel without them still
 * runs the job. */
static void v2_job_limits(const char *folder, const cgroup_place *where) {
    char text[32];
    write_text(folder, "memory.oom.group", "1");
    if (v2_pids && where->max_pids > 0) {
        snprintf(text, sizeof text, "%lld", where->max_pids);
        write_text(folder, "pids.max", text);
    }
}

int cgroup_create(cgroup *group, long long job_id, const cgroup_place *where, long long limit) {
    /* the memory group, limited to `limit` bytes (limit < 0: no limit, the group only holds
     * the job's processes so that none escapes the end); -1: none made */
    char limit_text[32];
    if (geteuid() != 0 || roles[CG_MEMORY].version == 0) return -1;
    if (make_group(&roles[CG_MEMORY], job_id, where, group->path, sizeof group->path) != 0) {
        group->path[0] = '\0';
        return -1;
    }
    group->version = roles[CG_MEMORY].version;
    if (group->version == 2) v2_job_limits(group->path, where);
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
        group->path[0] = '\0';
        group->version = 0;
        return -1;
    }
    return 0;
}

/* the group of `role`: the memory group where they share a hierarchy, else one of its own */
static void create_role(cgroup *group, int role, long long job_id, const cgroup_place *where, char *out, int *version) {
    const hierarchy *h = &roles[role];
    out[0] = '\0';
    *version = 0;
    if (geteuid() != 0 || h->version == 0) return;
    if (group->version && strcmp(h->mount, roles[CG_MEMORY].mount) == 0) {
        snprintf(out, sizeof group->path, "%s", group->path);
    } else if (make_group(h, job_id, where, out, sizeof group->path) != 0) {
        out[0] = '\0';
        return;
    }
    *version = h->version;
}

void cgroup_create_others(cgroup *group, long long job_id, const cgroup_place *where) {
    create_role(group, CG_DEVICES, job_id, where, group->devices, &group->devices_version);
    create_role(group, CG_CPUSET, job_id, where, group->cpuset, &group->cpuset_version);
    if (group->cpuset_version != 1 || strcmp(group->cpuset, group->path) == 0) return;
    /* a v1 cpuset group made under a parent without clone_children (someone else's) starts
     * empty: the parent's cpus and mems until the job's are set */
    if (v1_cpuset_empty(group->cpuset) && cgroup_bind_cpus(group, NULL, NULL) != 0) {
        rmdir(group->cpuset);
        group->cpuset[0] = '\0';
        group->cpuset_version = 0;
    }
}

int cgroup_folders(const cgroup *group, const char *out[CG_ROLES]) {
    const char *all[CG_ROLES] = {group->path, group->devices, group->cpuset};
    int n = 0;
    for (int i = 0; i < CG_ROLES; i++) {
        int seen = !all[i][0];
        for (int j = 0; j < n && !seen; j++) seen = strcmp(out[j], all[i]) == 0;
        if (!seen) out[n++] = all[i];
    }
    return n;
}

int cgroup_open_procs(const char *folder) {
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.procs", folder);
    return open(path, O_WRONLY | O_CLOEXEC | (fake_v2 ? O_CREAT : 0), 0644);
}

int cgroup_open_join(const char *folder) {
    /* A v1 group's tasks file, where "0" moves the writing thread alone: the kernel (6.0 and
     * later) then skips the global threadgroup lock whose every write-locking waits out an RCU
     * grace period (7.3 -> 0.15 ms for a job's three v1 groups here, issue 27). The child that
     * writes is single-threaded (of vfork or clone3), so its thread is the whole process.
     * cgroup.procs where there is no tasks file: v2, or a plain folder standing in for one. */
    char path[4200];
    snprintf(path, sizeof path, "%s/tasks", folder);
    int fd = fake_v2 ? -1 : open(path, O_WRONLY | O_CLOEXEC);
    return fd >= 0 ? fd : cgroup_open_procs(folder);
}

int cgroup_open_v2(const cgroup *group, const char **folder) {
    /* one v2 mount: the roles that are v2 share one group */
    *folder = group->version == 2 ? group->path : group->devices_version == 2 ? group->devices
            : group->cpuset_version == 2 ? group->cpuset : NULL;
    if (fake_v2) *folder = NULL; /* a plain folder, no cgroup: nothing is born there */
    if (*folder == NULL) return -1;
    return open(refuse_clone3 ? "/" : *folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

void cgroup_pids(const cgroup *group, pidlist *out) {
    /* every group holds the whole job (the child joins them all): the first one is enough */
    static buf text;
    const char *folders[CG_ROLES];
    char path[4200];
    pids_clear(out);
    if (cgroup_folders(group, folders) == 0) return;
    snprintf(path, sizeof path, "%s/cgroup.procs", folders[0]);
    if (read_file(path, &text) == 0) parse_pids(text.data, out);
}

/* the number after `key ` on a line of <folder>/<name> (memory.events, pids.events); 0 */
static long long event_count(const char *folder, const char *name, const char *key) {
    buf text = {0};
    char path[4200];
    long long count = 0;
    size_t len = strlen(key);
    snprintf(path, sizeof path, "%s/%s", folder, name);
    if (read_file(path, &text) == 0) {
        for (char *save, *line = strtok_r(text.data, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
            if (strncmp(line, key, len) == 0 && line[len] == ' ') count = strtoll(line + len + 1, NULL, 10);
    }
    free(text.data);
    return count;
}

long long cgroup_oom_kills(const cgroup *group) {
    if (group->version == 0) return 0;
    return event_count(group->path, group->version == 2 ? "memory.events" : "memory.oom_control", "oom_kill");
}

long long cgroup_pids_refused(const cgroup *group) {
    return group->version == 2 && v2_pids ? event_count(group->path, "pids.events", "max") : 0;
}

long long cgroup_peak(const cgroup *group) {
    buf text = {0};
    char path[4200];
    long long peak = 0;
    if (group->version == 0) return 0;
    snprintf(path, sizeof path, "%s/%s", group->path, group->version == 2 ? "memory.peak" : "memory.max_usage_in_bytes");
    if (read_file(path, &text) == 0) peak = strtoll(text.data, NULL, 10);
    free(text.data);
    return peak;
}

void cgroup_remove(const cgroup *group) {
    /* retried briefly: the kernel frees a group just after its last process exits */
    struct timespec pause = {0, 10 * 1000 * 1000};
    const char *folders[CG_ROLES];
    int n = cgroup_folders(group, folders);
    for (int i = 0; i < n; i++) {
        for (int attempt = 0; attempt < 200; attempt++) {
            if (rmdir(folders[i]) == 0 || errno == ENOENT) break;
            if (fake_v2 && errno == ENOTEMPTY) break; /* a fake tree's files: the test's to read */
            nanosleep(&pause, NULL);
        }
    }
}

/* ---- CPUs ---- */

int cgroup_bind_cpus(const cgroup *group, const char *cpus, const char *mems) {
    /* mems before cpus does not matter to the kernel; both must be subsets of the parent's */
    buf text = {0};
    char parent[4096], path[4200];
    int failed = 0;
    if (!group->cpuset[0]) return -1;
    snprintf(parent, sizeof parent, "%s", group->cpuset);
    char *slash = strrchr(parent, '/');
    if (slash != NULL) *slash = '\0';
    const char *names[2] = {"cpuset.cpus", "cpuset.mems"}, *wanted[2] = {cpus, mems};
    for (int i = 0; i < 2 && !failed; i++) {
        const char *value = wanted[i];
        if (value == NULL && group->cpuset_version == 2) continue; /* v2: the parent's already */
        if (value == NULL) {
            snprintf(path, sizeof path, "%s/%s", parent, names[i]);
            /* an empty parent (made by someone else, never filled) can give nothing */
            if (read_file(path, &text) != 0 || text.len == 0 || text.data[0] == '\n') { failed = 1; break; }
            value = text.data;
        }
        failed = write_text(group->cpuset, names[i], value) != 0;
    }
    free(text.data);
    return failed ? -1 : 0;
}

/* ---- devices ---- */

int parse_device_rule(const char *text, device_rule *out) {
    /* "<c|b> <major|*>:<minor|*>", numbers as the kernel takes them (major < 4096, minor < 2^20) */
    char type, major[16], minor[16], rest;
    if (sscanf(text, "%c %15[0-9*]:%15[0-9*]%c", &type, major, minor, &rest) != 3) return -1;
    if (type != 'c' && type != 'b') return -1;
    const char *parts[2] = {major, minor};
    long limits[2] = {4095, (1L << 20) - 1}, values[2];
    for (int i = 0; i < 2; i++) {
        char *end;
        if (strcmp(parts[i], "*") == 0) { values[i] = -1; continue; }
        values[i] = strtol(parts[i], &end, 10);
        if (*end || end == parts[i] || values[i] > limits[i]) return -1;
    }
    out->type = type;
    out->major = (int)values[0];
    out->minor = (int)values[1];
    return 0;
}

static int deny_v1(const char *folder, const device_rule *rules, size_t n, char *why, size_t size) {
    /* the group starts with its parent's exceptions (the root allows everything); each rule
     * takes one device away, everything else stays allowed */
    for (size_t i = 0; i < n; i++) {
        char text[64], major[16] = "*", minor[16] = "*";
        if (rules[i].major >= 0) snprintf(major, sizeof major, "%d", rules[i].major);
        if (rules[i].minor >= 0) snprintf(minor, sizeof minor, "%d", rules[i].minor);
        snprintf(text, sizeof text, "%c %s:%s rwm", rules[i].type, major, minor);
        if (write_text(folder, "devices.deny", text) != 0) {
            snprintf(why, size, "cannot write devices.deny (%s): %s", text, strerror(errno));
            return -1;
        }
    }
    return 0;
}

#define INSN(code, dst, src, off, imm) ((struct bpf_insn){code, dst, src, off, imm})

size_t device_program(const device_rule *rules, size_t n, void *out) {
    /* r2 = device type (the low 16 bits of access_type), r3 = major, r4 = minor; for each rule
     * a run of "jump to the next rule unless it matches" ending in "return 0" (deny); past the
     * last rule "return 1" (allow). A "*" in a rule skips that comparison. */
    struct bpf_insn *insns = out;
    size_t k = 0;
    insns[k++] = INSN(BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_1, offsetof(struct bpf_cgroup_dev_ctx, access_type), 0);
    insns[k++] = INSN(BPF_ALU64 | BPF_AND | BPF_K, BPF_REG_2, 0, 0, 0xFFFF);
    insns[k++] = INSN(BPF_LDX | BPF_MEM | BPF_W, BPF_REG_3, BPF_REG_1, offsetof(struct bpf_cgroup_dev_ctx, major), 0);
    insns[k++] = INSN(BPF_LDX | BPF_MEM | BPF_W, BPF_REG_4, BPF_REG_1, offsetof(struct bpf_cgroup_dev_ctx, minor), 0);
    for (size_t i = 0; i < n; i++) {
        int type = rules[i].type == 'c' ? BPF_DEVCG_DEV_CHAR : BPF_DEVCG_DEV_BLOCK;
        int checks = 1 + (rules[i].major >= 0) + (rules[i].minor >= 0);
        /* each check jumps over what is left of this rule: the other checks and the 2 of deny */
        int left = checks + 2;
        insns[k++] = INSN(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_2, 0, (short)(--left), type);
        if (rules[i].major >= 0) insns[k++] = INSN(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_3, 0, (short)(--left), rules[i].major);
        if (rules[i].minor >= 0) insns[k++] = INSN(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_4, 0, (short)(--left), rules[i].minor);
        insns[k++] = INSN(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0);
        insns[k++] = INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    }
    insns[k++] = INSN(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1);
    insns[k++] = INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    return k;
}

/* BPF_PROG_LOAD with RLIMIT_MEMLOCK raised to infinity for the load alone, as runc does:
 * kernels before 5.11 charge BPF programs to it, and loads start failing after a while under a
 * distribution's 64 KiB or 8 MiB default. The previous limit is back before the job is forked,
 * so the job never inherits the raised one. A limit that cannot be raised is tried as it is. */
static int load_program(union bpf_attr *load) {
    struct rlimit before, unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    int have = getrlimit(RLIMIT_MEMLOCK, &before) == 0;
    int raised = have && setrlimit(RLIMIT_MEMLOCK, &unlimited) == 0;
    int prog = (int)syscall(SYS_bpf, BPF_PROG_LOAD, load, sizeof *load);
    int saved = errno;
    if (raised) setrlimit(RLIMIT_MEMLOCK, &before);
    errno = saved;
    return prog;
}

/* a loaded cgroup device program for `insns`, or -1 with `why` set (the verifier's log in it) */
static int load_device_program(struct bpf_insn *insns, size_t n, char *why, size_t size) {
    static char log[4096];
    union bpf_attr load;
    /* TEST ONLY: GPUQ_TEST_DEVICE_PROGRAM_FAIL=1 fails every load as a kernel would (EPERM),
     * so that tests see what a failed load does to a job and to the node's claim */
    const char *forced = getenv("GPUQ_TEST_DEVICE_PROGRAM_FAIL");
    if (forced && strcmp(forced, "1") == 0) {
        snprintf(why, size, "cannot load a cgroup v2 device program: %s (forced by GPUQ_TEST_DEVICE_PROGRAM_FAIL)", strerror(EPERM));
        return -1;
    }
    memset(&load, 0, sizeof load);
    load.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
    load.insn_cnt = (unsigned)n;
    load.insns = (unsigned long)insns;
    load.license = (unsigned long)"Dual MIT/GPL";
    int prog = load_program(&load);
    if (prog >= 0) return prog;
    int saved = errno;
    /* again with the verifier's log, for the reason (a log that does not fit fails a load by
     * itself, so the first try has none) */
    load.log_buf = (unsigned long)log;
    load.log_size = sizeof log;
    load.log_level = 1;
    log[0] = '\0';
    int again = load_program(&load);
    if (again >= 0) close(again);
    snprintf(why, size, "cannot load a cgroup v2 device program: %s%s%.200s", strerror(saved), log[0] ? ": " : "", log);
    return -1;
}

int device_program_probe(char *why, size_t size) {
    struct bpf_insn insns[8];
    int prog = load_device_program(insns, device_program(NULL, 0, insns), why, size);
    if (prog < 0) return -1;
    close(prog);
    return 0;
}

static int deny_v2(const char *folder, const device_rule *rules, size_t n, char *why, size_t size) {
    /* load the program, attach it to the job's group; ALLOW_MULTI: it runs with whatever the
     * parents attached (systemd's own device policy), and any of them can deny. The group holds
     * the program until it is removed. */
    static struct bpf_insn insns[6 + 5 * MAX_DEVICE_RULES];
    int prog = load_device_program(insns, device_program(rules, n, insns), why, size);
    if (prog < 0) return -1;
    int dir = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    union bpf_attr attach;
    memset(&attach, 0, sizeof attach);
    attach.target_fd = (unsigned)dir;
    attach.attach_bpf_fd = (unsigned)prog;
    attach.attach_type = BPF_CGROUP_DEVICE;
    attach.attach_flags = BPF_F_ALLOW_MULTI;
    int failed = dir < 0 || syscall(SYS_bpf, BPF_PROG_ATTACH, &attach, sizeof attach) != 0;
    if (failed) snprintf(why, size, "cannot attach a cgroup v2 device program: %s", strerror(errno));
    if (dir >= 0) close(dir);
    close(prog);
    return failed ? -1 : 0;
}

int cgroup_deny_devices(const cgroup *group, const device_rule *rules, size_t n, const char **how,
                        char *why, size_t size) {
    if (!group->devices[0]) {
        snprintf(why, size, geteuid() != 0 ? "the agent does not run as root" : roles[CG_DEVICES].version ? "cannot make the job's devices cgroup" : "no devices cgroup on this machine");
        return -1;
    }
    if (group->devices_version == 1) {
        *how = "devices cgroup v1";
        return deny_v1(group->devices, rules, n, why, size);
    }
    *how = "cgroup v2 device program";
    return deny_v2(group->devices, rules, n, why, size);
}
