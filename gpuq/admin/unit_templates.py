"""The systemd units `gpuq admin install` writes: the one source of them (no copies elsewhere).

Each is a string.Template: $gpuq is this installation's `gpuq` command, $sleep the absolute path
of `sleep`, $user and $group the coordinator's service account. Every setting says why it is
there, so that an admin reading /etc/systemd/system/gpuq-*.service learns what it costs.
"""

from __future__ import annotations

from string import Template

COORDINATOR = Template("""\
# gpuq coordinator: the queue, the scheduler and the job store of a gpuq cluster.
# Written by `gpuq admin install`; settings live in /etc/gpuq/config.toml.
[Unit]
Description=gpuq coordinator (GPU batch queue)
Documentation=https://pypi.org/project/lab-gpu-queue/
# PostgreSQL, when the store is not the default SQLite file, must be up first
After=network-online.target postgresql.service
Wants=network-online.target

[Service]
Type=exec
# a system user of its own, not root: [coordinator] service_user = "$user" makes a coordinator
# running as exactly this user serve every user of the machine (who calls is learnt per call:
# SO_PEERCRED on its socket, tokens over TCP), and makes root, $user and [coordinator]
# admin_group its admins
User=$user
Group=$group
Environment=GPUQ_HOME=/var/lib/gpuq
ExecStart=$gpuq coordinator
# SIGTERM stops it cleanly; running jobs are owned by the agents' supervisors and keep running
KillSignal=SIGTERM
TimeoutStopSec=30
# exit 3 (the database is not reachable yet, or another coordinator still holds this store)
# is worth retrying; exit 2 (a wrong setting in config.toml) is not: fix it, then start again
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=2
# /var/lib/gpuq, owned by $user (systemd chowns it at every start: no other unit may declare
# it). 0711: users reach the sockets by name (gpuq.sock, gpuq.sock.auth) and nothing else; the
# database, auth.key and nodes/ inside are private
StateDirectory=gpuq
StateDirectoryMode=0711
UMask=0077
LimitNOFILE=65536

# ---- hardening (`systemd-analyze security gpuq-coordinator`: 1.6 on systemd 252) ----
# It needs its state folder, /etc/gpuq (read), the network (gRPC, the dashboard, webhooks,
# PostgreSQL, SMTP) and nothing else. Not here: PrivateUsers= (callers' uids from SO_PEERCRED
# would read as nobody), PrivateNetwork= (it serves TCP).
# No privilege can be gained: a setuid or setgid mail program (Postfix's sendmail runs the
# setgid postdrop, Exim's is setuid root) cannot queue mail from here; set [coordinator]
# mail_program to one that submits over SMTP (msmtp, README "Notifications").
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
RestrictSUIDSGID=yes
# the file system is read-only but for /var/lib/gpuq. Homes stay readable as Unix permissions
# allow $user: the dashboard's log view shows a job's output where $user may read it
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
DevicePolicy=closed
PrivateIPC=yes
RemoveIPC=yes
KeyringMode=private
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
# it reads no other process's /proc (the dashboard's log view uses its own /proc/self/fd)
ProtectProc=invisible
ProcSubset=pid
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
LockPersonality=yes
# Python, grpcio and cryptography map no writable code
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
# the calls a service makes, less the privileged ones (@resources stays: glibc's getrlimit is
# prlimit64, which subprocess and grpc may call)
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
""")

AGENT = Template("""\
# gpuq agent: runs on every GPU node; discovers the GPUs through NVML and runs jobs through
# per-job supervisors. Written by `gpuq admin install`; settings live in /etc/gpuq/config.toml
# ([agent] coordinator, node_key, cgroup_parent and, on a node of its own, the TLS files).
[Unit]
Description=gpuq node agent (GPU batch queue)
Documentation=https://pypi.org/project/lab-gpu-queue/
After=network-online.target nvidia-persistenced.service gpuq-coordinator.service gpuq-jobs.service
Wants=network-online.target gpuq-jobs.service

[Service]
Type=exec
# root: a job runs as its submitter, and only root switches users
User=root
# its own state folder: StateDirectory=gpuq would chown the coordinator's /var/lib/gpuq to root
# at every start. It reaches the coordinator and its node key through /etc/gpuq/config.toml.
Environment=GPUQ_HOME=/var/lib/gpuq-agent
StateDirectory=gpuq-agent
StateDirectoryMode=0700
ExecStart=$gpuq agent
# Only the agent itself is stopped on restart or upgrade: supervisors and jobs live on, and the
# next agent re-adopts them (KillMode=process). Job cgroups live in gpuq-jobs.service
# ([agent] cgroup_parent), not here.
KillMode=process
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=always
RestartSec=2
# exit 2 is a wrong setting in config.toml: restarting cannot fix it (journalctl says which)
RestartPreventExitStatus=2
LimitNOFILE=1048576
# job folders live in /dev/shm/gpuq-<random> (see [agent] run_dir): no PrivateDevices=, which would
# give each agent start a fresh /dev/shm and lose the running jobs' folders

# ---- hardening ----
# Jobs are this agent's descendants: they inherit its capability bounding set, seccomp filters,
# NoNewPrivileges and mount namespace. So nothing here changes what a job sees or may do: no
# NoNewPrivileges (setuid helpers: newuidmap for rootless podman, fusermount3, nvidia-modprobe),
# no ProtectSystem/ProtectHome/PrivateTmp (jobs need the real file system and /tmp), no
# SystemCallFilter/SystemCallArchitectures/LockPersonality (32-bit programs, gdb's personality),
# no ProtectKernelModules (nvidia-modprobe loads nvidia-uvm), no ProtectClock or DeviceAllow
# (a device list would deny the GPUs to the agent's NVML and the supervisors).
# The capabilities it keeps, each for a reason; a job's setuid programs get at most these:
#   CAP_SETUID CAP_SETGID   become a job's user and groups (also newuidmap/newgidmap in jobs)
#   CAP_KILL                signal other users' jobs (cancel, time limit, fencing, leftovers)
#   CAP_CHOWN               give a job its folder, terminal and MPS pipe folder
#   CAP_FOWNER              change and remove what a job's user owns in its folder
#   CAP_DAC_OVERRIDE        read and remove job folders and write cgroup files of any owner
#   CAP_SYS_PTRACE          read other users' /proc/PID/environ and fd/ (which job a GPU
#                           process belongs to, MPS clients)
#   CAP_SYS_ADMIN           load cgroup device programs (BPF; it covers CAP_BPF), set a GPU's
#                           compute mode for MPS (NVML); fusermount3 in jobs
#   CAP_NET_ADMIN           attach those programs on kernels before 5.8
#   CAP_SYS_RESOURCE        BPF programs count against RLIMIT_MEMLOCK before kernel 5.11
#   CAP_MKNOD CAP_SYS_MODULE  nvidia-modprobe (setuid root, run by NVML and CUDA) makes
#                           /dev/nvidia-uvm and /dev/nvidia-caps nodes and loads nvidia-uvm
CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL CAP_CHOWN CAP_FOWNER CAP_DAC_OVERRIDE
CapabilityBoundingSet=CAP_SYS_PTRACE CAP_SYS_ADMIN CAP_NET_ADMIN CAP_SYS_RESOURCE
CapabilityBoundingSet=CAP_MKNOD CAP_SYS_MODULE
# only the kernel log is hidden (users cannot read it either: kernel.dmesg_restrict)
ProtectKernelLogs=yes

[Install]
WantedBy=multi-user.target
""")

JOBS = Template("""\
# gpuq jobs: the cgroup subtree that holds every job of this node ([agent] cgroup_parent =
# "system.slice/gpuq-jobs.service"). Written by `gpuq admin install`.
#
# STOPPING THIS UNIT STOPS EVERY JOB ON THE NODE (systemd kills what is below it). Upgrades never
# need to restart it: restart gpuq-agent only.
#
# Why a unit of its own, not the agent's: on systemd < 254 (Debian 12, Ubuntu 22.04) a
# delegated unit whose cgroup has controllers enabled cannot start a new main process while
# processes remain below it (EBUSY, systemd issues #24064 and #41278). The agent keeps jobs
# running across its own restarts (KillMode=process), so with the jobs below the agent every
# agent restart would fail until its jobs were fenced. SLURM keeps job steps in
# slurmstepd.scope, apart from slurmd.service, for the same reason.
[Unit]
Description=gpuq jobs (the cgroup subtree of this node's jobs)
Documentation=https://pypi.org/project/lab-gpu-queue/
Before=gpuq-agent.service

[Service]
Type=exec
# a placeholder main process: the unit exists to own the cgroup
ExecStart=$sleep infinity
# systemd leaves the subtree to the agent, which makes <key>/job_<id> groups there and
# enables these controllers for them
Delegate=cpuset memory pids
# the placeholder's end stops the unit, and with it every job below: never the OOM killer's pick
# (only the placeholder gets this score; jobs keep their own)
OOMScoreAdjust=-1000
Restart=always
RestartSec=2

# ---- hardening, of the placeholder only ----
# Options that act through the cgroup would bind every job below it: none of them here. No
# PrivateDevices=, DevicePolicy=, DeviceAllow= or ProtectClock= (a device list on this cgroup
# would deny jobs their GPUs whatever the agent allows), no IPAddressDeny=, no resource limits.
# What follows applies to the `sleep` process alone (namespaces, seccomp, capabilities).
NoNewPrivileges=yes
CapabilityBoundingSet=
PrivateNetwork=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictAddressFamilies=none
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service

[Install]
WantedBy=multi-user.target
""")
