/* The per-job supervisor and the fork server, in C (see supervisor.c for why).
 *
 * Everything here runs in a process forked from the fork server: single-threaded, never back
 * into Python, ending in _exit(). Memory is allocated and not freed where the process is about
 * to exit anyway. */
#ifndef GPUQ_SUPERVISE_H
#define GPUQ_SUPERVISE_H

#include <stddef.h>
#include <sys/types.h>

/* ---- json.c: the parts of JSON the job folder and the agent protocol use ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    int boolean;
    double num;
    char *str; /* J_STR: decoded UTF-8, NUL-terminated; len excludes the NUL */
    size_t len;
    size_t n;            /* J_ARR, J_OBJ: number of items */
    struct jval *items;  /* J_ARR, J_OBJ */
    char **keys;         /* J_OBJ */
} jval;

/* Parse `len` bytes; NULL when they are not one JSON value. */
jval *json_parse(const char *text, size_t len);
void json_free(jval *value);
const jval *json_get(const jval *object, const char *key);
/* Typed getters: `fallback` when the key is absent, null or of another type. */
const char *json_str(const jval *object, const char *key, const char *fallback);
double json_num(const jval *object, const char *key, double fallback);
int json_has_num(const jval *object, const char *key);
/* A whole number in [min, max]: 1 with *out set; 0 when absent, not a number, fractional, NaN
 * or out of range (range-checked as a double first: casting one out of range is undefined). */
int json_int(const jval *object, const char *key, long long min, long long max, long long *out);
/* A number in [min, max] (so finite when they are); `fallback` otherwise. */
double json_real(const jval *object, const char *key, double min, double max, double fallback);
/* A string without NUL bytes (a path, an argument): 0 when absent or unusable. */
int json_cstr(const jval *object, const char *key, const char **out);

typedef struct {
    char *data;
    size_t len, cap;
} buf;

void buf_add(buf *b, const char *data, size_t len);
void buf_addf(buf *b, const char *format, ...) __attribute__((format(printf, 2, 3)));
void buf_str(buf *b, const char *text); /* a JSON string literal; invalid UTF-8 -> U+FFFD */
void buf_consume(buf *b, size_t count); /* drop the first `count` bytes */

/* ---- proc.c: the job's processes ---- */

typedef struct {
    pid_t *pids;
    size_t n, cap;
} pidlist;

void pids_add(pidlist *list, pid_t pid);
int pids_has(const pidlist *list, pid_t pid);
void pids_clear(pidlist *list);
int read_file(const char *path, buf *out); /* 0, or -1 with errno */
void parse_pids(const char *text, pidlist *out); /* pids, one per word, added */
void descendants(pid_t root, pidlist *out);
int has_exited(pid_t pid);
long long start_time(pid_t pid);
int group_alive(pid_t pgid);
void signal_tree(pid_t root, pid_t pgid, int sig, const pidlist *extra);
long long tree_rss(const pidlist *pids);
void signal_name(int sig, char *out, size_t size);

/* ---- cgroups.c: the job's cgroups, its CPUs and its device rules ---- */

/* The job's groups: one per cgroup hierarchy gpuq uses, at the same relative path in each.
 * On cgroup v2 the roles share one group; on v1 each controller has its own hierarchy. */
enum { CG_MEMORY, CG_DEVICES, CG_CPUSET, CG_ROLES };

typedef struct {
    char path[4096]; /* the memory group (limits, OOM kills, peak); "" when none */
    int version;     /* of the memory group: 1 or 2; 0: none */
    char devices[4096], cpuset[4096]; /* "" when none; equal to `path` where they are one group */
    int devices_version, cpuset_version;
} cgroup;

typedef struct {
    char type;        /* 'c' or 'b' */
    int major, minor; /* -1: any */
} device_rule;

#define MAX_DEVICE_RULES 256

/* Where a job's groups go and what the v2 ones get, from the launch spec. */
typedef struct {
    const char *parent;    /* <cgroup_parent>/<key>, relative to each hierarchy's mount */
    /* the delegated subtree (relative to the v2 mount, e.g. system.slice/gpuq-jobs.service),
     * which holds `parent`: controllers are enabled at it and below, never above (systemd
     * owns those levels). NULL: from the mount down (a host without systemd) */
    const char *delegated;
    long long max_pids;    /* v2 pids.max of each job; 0: none */
} cgroup_place;

void cgroup_detect(void); /* once, in the fork server: supervisors inherit the answer */
int cgroup_create(cgroup *group, long long job_id, const cgroup_place *where, long long limit);
/* The job's groups in the devices and cpuset hierarchies (where they differ from the memory
 * group's); what could not be made stays "". */
void cgroup_create_others(cgroup *group, long long job_id, const cgroup_place *where);
/* How often a fork of the job was refused by its pids.max (pids.events "max"); 0 off v2. */
long long cgroup_pids_refused(const cgroup *group);
/* Load and close a trivial cgroup device program (RLIMIT_MEMLOCK raised around the load, as
 * for a job): 0, or -1 with `why` set. The doctor's check that v2 device rules can work. */
int device_program_probe(char *why, size_t size);
/* The distinct folders of the job's groups, memory first; how many (at most CG_ROLES). */
int cgroup_folders(const cgroup *group, const char *out[CG_ROLES]);
int cgroup_open_procs(const char *folder);
/* Where the job's child writes "0" to join the group in `folder` (O_WRONLY): a v1 group's
 * tasks file, else cgroup.procs. */
int cgroup_open_join(const char *folder);
/* The job's v2 group, for the child to be born in (clone3's CLONE_INTO_CGROUP): its folder in
 * *folder and open (O_DIRECTORY); -1 where it has none (*folder NULL) or the open failed. */
int cgroup_open_v2(const cgroup *group, const char **folder);
void cgroup_pids(const cgroup *group, pidlist *out);
long long cgroup_oom_kills(const cgroup *group);
long long cgroup_peak(const cgroup *group);
void cgroup_remove(const cgroup *group);
/* Deny `rules` to the job's devices group; 0, or -1 with `why` set (isolation is advisory). On
 * success *how names the mechanism: "devices cgroup v1" or "cgroup v2 device program". */
int cgroup_deny_devices(const cgroup *group, const device_rule *rules, size_t n, const char **how,
                        char *why, size_t why_size);
int parse_device_rule(const char *text, device_rule *out); /* "c 195:1" or "b 8:*": 0, or -1 */
/* The BPF_PROG_TYPE_CGROUP_DEVICE program for `rules` (deny them, allow the rest); its length
 * in instructions, written to insns (room for 6 + 5 * n). */
size_t device_program(const device_rule *rules, size_t n, void *insns);
/* Bind the job's cpuset group to `cpus` and `mems` (either NULL: the parent's); 0, or -1. */
int cgroup_bind_cpus(const cgroup *group, const char *cpus, const char *mems);

/* ---- supervisor.c ---- */

int supervise(const char *job_dir, double ack_wait); /* the exit code */

#endif
