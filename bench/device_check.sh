#!/usr/bin/env bash
# gpuq on a real NVIDIA machine (issue 10, item 11): prints what the driver reports, what gpuq's
# agent measured and what a job sees. Read-only for the GPU: it never changes MIG mode or compute
# mode, never resets a GPU, never starts MPS. Every step runs even when an earlier one failed; a
# summary at the end says which did. About 1-2 minutes; the whole run is bounded to ~4 minutes.
#
#   bash bench/device_check.sh                       # from anywhere; the repo is this file's ../
#   WHEELHOUSE=/path/to/wheels bash bench/device_check.sh   # offline: install from these wheels
#
# Environment: WHEELHOUSE (folder of wheels for `pip install --no-index --find-links`; default
# REPO/build/wheelhouse when it exists: build/ is git-ignored, so a run machine gets it only when
# the caller carries it; make it with
#   .venv/bin/pip wheel -w build/wheelhouse . setuptools wheel
# on a machine with the same Python version and architecture),
# PYTHON (default python3), KEEP=1 (keep the temp folder), ALLOC_GIB (default 2), HOLD_S (8).
# Exit status: 0 when every step passed or was skipped, 1 otherwise.

set -u
set -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROBE="$REPO/bench/device_probe.py"
PYTHON=${PYTHON:-python3}
ALLOC_GIB=${ALLOC_GIB:-2}
HOLD_S=${HOLD_S:-8}
START=$SECONDS
if [[ -z ${WHEELHOUSE:-} && -d $REPO/build/wheelhouse ]]; then
    WHEELHOUSE="$REPO/build/wheelhouse"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpuq-device-check.XXXXXX")
HOME_DIR="$WORK/home"
JOBS_DIR="$WORK/jobs"
mkdir -p "$HOME_DIR" "$JOBS_DIR"
GPUQ=()          # how to run gpuq: set by step 1
VPY="$PYTHON"    # the python with gpuq (and nvidia-ml-py) when step 1 installed it
SERVE_PID=""
JOB_IDS=()
STEPS=()
declare -A RESULT=()

section() {
    printf '\n==================== %s  [t+%ds]\n' "$1" "$((SECONDS - START))"
}

# record STEP STATUS [NOTE]: STATUS is ok, failed or skipped
record() {
    [[ -v "RESULT[$1]" ]] || STEPS+=("$1")
    RESULT[$1]="$2${3:+ ($3)}"
    echo "  -> $1: ${RESULT[$1]}"
}

# run a command with a time limit, its output indented; returns its status
run() {
    local limit=$1
    shift
    echo "\$ $*"
    timeout --kill-after=5 "$limit" "$@" 2>&1 | sed 's/^/    /'
    local rc=${PIPESTATUS[0]}
    [[ $rc -eq 0 ]] || echo "    -> exit $rc$([[ $rc -eq 124 ]] && echo ' (timed out)')"
    return "$rc"
}

g() { "${GPUQ[@]}" --home "$HOME_DIR" "$@"; }

# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    local pid
    if [[ ${#GPUQ[@]} -gt 0 && ${#JOB_IDS[@]} -gt 0 && -n $SERVE_PID ]]; then
        timeout 10 "${GPUQ[@]}" --home "$HOME_DIR" cancel "${JOB_IDS[@]}" >/dev/null 2>&1
    fi
    if [[ -n $SERVE_PID ]] && kill -0 "$SERVE_PID" 2>/dev/null; then
        kill -TERM "$SERVE_PID" 2>/dev/null
        for _ in $(seq 1 50); do
            kill -0 "$SERVE_PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -0 "$SERVE_PID" 2>/dev/null && kill -KILL "$SERVE_PID" 2>/dev/null
    fi
    # whatever this run started and left (supervisors, jobs) carries this run's folder
    local pids=()
    mapfile -t pids < <(grep -l -s -F "$WORK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
    for pid in "${pids[@]}"; do
        [[ $pid != "$$" ]] && kill -KILL "$pid" 2>/dev/null
    done
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM
export GPUQ_DEVICE_CHECK_DIR="$WORK"  # the marker cleanup looks for

echo "gpuq device check: $(date -u +%FT%TZ) on $(hostname), repo $REPO, work $WORK"
echo "kernel $(uname -r); $("$PYTHON" --version 2>&1); user $(id -un) (uid $(id -u))"

# ---------------------------------------------------------------- 1. install
step_install() {
    section "1. install gpuq into a fresh venv"
    local venv="$WORK/venv" how=""
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_CACHE_DIR="$WORK/pip-cache"
    if run 60 "$PYTHON" -m venv "$venv"; then
        if [[ -n ${WHEELHOUSE:-} && -d ${WHEELHOUSE:-} ]]; then
            run 150 "$venv/bin/pip" install --no-index --find-links "$WHEELHOUSE" -e "$REPO" \
                && how="wheelhouse $WHEELHOUSE"
            if [[ -z $how ]] && compgen -G "$WHEELHOUSE/lab_gpu_queue-*.whl" >/dev/null; then
                echo "(editable install failed: no C compiler or headers? the wheelhouse's gpuq wheel)"
                run 90 "$venv/bin/pip" install --no-index --find-links "$WHEELHOUSE" lab-gpu-queue \
                    && how="wheelhouse $WHEELHOUSE, built wheel (not editable)"
            fi
        else
            echo "(WHEELHOUSE not set or not a folder: trying the package index)"
        fi
        if [[ -z $how ]]; then
            run 60 "$venv/bin/pip" install --timeout 5 --retries 1 -e "$REPO" && how="index"
        fi
    fi
    if [[ -z $how ]]; then
        # offline and no wheelhouse: a venv that sees the system's packages, no build isolation
        echo "(falling back to a venv with --system-site-packages, no index)"
        rm -rf "$venv"
        run 60 "$PYTHON" -m venv --system-site-packages "$venv" \
            && run 60 "$venv/bin/pip" install --no-index --no-build-isolation -e "$REPO" \
            && how="system site-packages"
    fi
    if [[ -n $how ]] && run 30 "$venv/bin/gpuq" --version; then
        GPUQ=("$venv/bin/gpuq")
        VPY="$venv/bin/python"
        record "1 install" ok "$how"
        return 0
    fi
    if [[ -x $REPO/.venv/bin/gpuq ]] && run 30 "$REPO/.venv/bin/gpuq" --version; then
        GPUQ=("$REPO/.venv/bin/gpuq")
        VPY="$REPO/.venv/bin/python"
        record "1 install" failed "using the repo's .venv instead"
        return 1
    fi
    record "1 install" failed "no gpuq: steps 3-4 skipped; NVML/CUDA probes use $PYTHON"
    return 1
}

# ---------------------------------------------------------------- 2. NVML discovery
step_nvml() {
    section "2. NVML discovery (read-only)"
    local rc=0 d
    echo "--- nvidia-smi -L / query (read-only)"
    if command -v nvidia-smi >/dev/null; then
        run 20 nvidia-smi -L
        run 20 nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,mig.mode.current,compute_mode,driver_version --format=csv
    else
        echo "    nvidia-smi: not installed"
    fi
    echo "--- device_probe.py nvml ($VPY)"
    run 60 "$VPY" "$PROBE" nvml | tee "$WORK/nvml.txt" || rc=1
    echo "--- /proc/driver/nvidia"
    run 5 head -n 3 /proc/driver/nvidia/version || echo "    (no /proc/driver/nvidia: no driver)"
    echo "--- /proc/driver/nvidia-caps/mig-minors (head)"
    run 5 head -n 12 /proc/driver/nvidia-caps/mig-minors || echo "    (none)"
    echo "--- /dev/nvidia*"
    # shellcheck disable=SC2012  # listings for a person to read
    {
        ls -l /dev/nvidia* 2>&1
        [[ -d /dev/nvidia-caps ]] && ls -l /dev/nvidia-caps | head -n 12
    } | sed 's/^/    /'
    echo "--- cgroups"
    echo "    /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup 2>&1) (cgroup2fs = v2, tmpfs = v1)"
    [[ -f /sys/fs/cgroup/cgroup.controllers ]] \
        && echo "    v2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
    grep -E '^(devices|cpuset|memory)\b' /proc/cgroups 2>/dev/null | sed 's/^/    \/proc\/cgroups: /'
    echo "    this shell: $(tr '\n' ' ' </proc/self/cgroup)"
    for d in /sys/fs/cgroup/devices /sys/fs/cgroup/cpuset; do
        [[ -d $d ]] && echo "    $d present"
    done
    echo "    PID 1: $(cat /proc/1/comm 2>/dev/null); in a container: $([[ -f /.dockerenv || -f /run/.containerenv ]] && echo yes || echo 'no sign')"
    if grep -q '^ *no driver' "$WORK/nvml.txt"; then
        record "2 NVML discovery" ok "no driver"
    elif [[ $rc -eq 0 ]]; then
        record "2 NVML discovery" ok "$(grep -c '^ *GPU [0-9]*$' "$WORK/nvml.txt") GPUs"
    else
        record "2 NVML discovery" failed
    fi
    return "$rc"
}

# ---------------------------------------------------------------- 3. gpuq serve on NVML
NODE_GPUS=0
NODE_FAKE=""
step_serve() {
    section "3. gpuq serve (NVML: no --fake-gpus) in $HOME_DIR"
    if [[ ${#GPUQ[@]} -eq 0 ]]; then
        record "3 gpuq serve" skipped "gpuq not installed"
        return 0
    fi
    run 20 "${GPUQ[@]}" serve --help | head -n 30
    echo "\$ gpuq --home $HOME_DIR serve --log-level info &"
    # GPUQ_DEBUG=1: should serve die, its log has the traceback
    GPUQ_DEBUG=1 "${GPUQ[@]}" --home "$HOME_DIR" serve --log-level info >"$WORK/serve.log" 2>&1 &
    SERVE_PID=$!
    local up="" i
    for i in $(seq 1 120); do  # up to 30 s
        if ! kill -0 "$SERVE_PID" 2>/dev/null; then
            echo "    gpuq serve exited:"
            sed 's/^/    | /' "$WORK/serve.log"
            SERVE_PID=""
            record "3 gpuq serve" failed "serve exited"
            return 1
        fi
        if g nodes --json 2>/dev/null | grep -q '"state": "up"'; then
            up=yes
            break
        fi
        sleep 0.25
    done
    echo "    node up: ${up:-no} after $((i / 4)) s"
    echo "--- serve log"
    sed 's/^/    | /' "$WORK/serve.log"
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" nodes
    echo "\$ gpuq nodes --json"
    timeout 15 "${GPUQ[@]}" --home "$HOME_DIR" nodes --json >"$WORK/nodes.json" 2>&1
    sed 's/^/    /' "$WORK/nodes.json"
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" status
    read -r NODE_GPUS NODE_FAKE < <("$PYTHON" -c '
import json, sys
nodes = json.load(open(sys.argv[1]))
print(sum(len(n.get("gpus", [])) for n in nodes), any(n.get("fake") for n in nodes))
' "$WORK/nodes.json" 2>/dev/null || echo "0 unknown")
    echo "    GPUs registered: $NODE_GPUS; fake: $NODE_FAKE"
    if [[ -z $up ]]; then
        record "3 gpuq serve" failed "node not up in 30 s"
        return 1
    fi
    if [[ $NODE_FAKE == True ]]; then
        record "3 gpuq serve" ok "node up with FAKE GPUs: no NVML here"
    else
        record "3 gpuq serve" ok "node up, $NODE_GPUS NVML GPUs"
    fi
}

# ---------------------------------------------------------------- 4. jobs
late() {  # STEP: true (and the step is recorded as skipped) once the run is past its budget
    if ((SECONDS - START > ${BUDGET_S:-180})); then
        record "$1" skipped "out of time ($((SECONDS - START)) s)"
        return 0
    fi
    return 1
}

submit_wait() {  # NAME LIMIT gpuq-submit-args...: runs a job to its end, prints its output
    local name=$1 limit=$2 rc id
    shift 2
    local output="$JOBS_DIR/$name.out"
    echo "\$ gpuq submit --wait -J $name -o $output $*"
    (cd "$JOBS_DIR" && timeout --kill-after=5 "$limit" "${GPUQ[@]}" --home "$HOME_DIR" \
        submit --wait -J "$name" -o "$output" "$@") 2>&1 | tee "$WORK/$name.submit" | sed 's/^/    /'
    rc=${PIPESTATUS[0]}
    id=$(sed -n 's/^Submitted job \([0-9_]*\).*/\1/p' "$WORK/$name.submit" | head -n 1)
    [[ -n $id ]] && JOB_IDS+=("$id")
    echo "    -> exit $rc; job ${id:-none}; its output:"
    sed 's/^/    | /' "$output" 2>/dev/null || echo "    (no output file)"
    return "$rc"
}

# shellcheck disable=SC2016  # expanded in the job, not here
JOB_SCRIPT='echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
echo "CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER-<unset>}"
echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-<unset>}"
echo "cgroup: $(tr "\n" " " </proc/self/cgroup)"'

step_job_gpu() {
    section "4a. a 1-GPU job: what it sees"
    if [[ -z $SERVE_PID ]]; then record "4a 1-GPU job" skipped "no gpuq serve"; return 0; fi
    late "4a 1-GPU job" && return 0
    if [[ $NODE_GPUS -lt 1 ]]; then record "4a 1-GPU job" skipped "the node has no GPU"; return 0; fi
    if submit_wait gpu1 60 --gpus 1 --wrap "$JOB_SCRIPT
$PYTHON $PROBE cuda"; then
        local seen
        seen=$(sed -n 's/.*cuDeviceGetCount: \([0-9]*\).*/\1/p' "$JOBS_DIR/gpu1.out")
        if grep -q 'no driver' "$JOBS_DIR/gpu1.out"; then
            record "4a 1-GPU job" ok "ran; no driver in the job"
        else
            record "4a 1-GPU job" ok "ran; job saw ${seen:-no} GPU(s)"
        fi
    else
        record "4a 1-GPU job" failed
        return 1
    fi
}

step_job_escape() {
    section "4b. a 0-GPU job that unsets CUDA_VISIBLE_DEVICES (escape attempt)"
    if [[ -z $SERVE_PID ]]; then record "4b 0-GPU escape" skipped "no gpuq serve"; return 0; fi
    late "4b 0-GPU escape" && return 0
    if submit_wait escape 60 --gpus 0 --wrap "$JOB_SCRIPT
unset CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES
echo 'after unset:'
$PYTHON $PROBE cuda"; then
        local seen
        seen=$(sed -n 's/.*cuDeviceGetCount: \([0-9]*\).*/\1/p' "$JOBS_DIR/escape.out")
        if grep -q 'no driver' "$JOBS_DIR/escape.out"; then
            record "4b 0-GPU escape" ok "ran; no driver in the job"
        elif [[ -n $seen && $seen -gt 0 ]]; then
            echo "    NOTE: the 0-GPU job saw $seen device(s): no device isolation"
            record "4b 0-GPU escape" ok "ran; job SAW $seen GPU(s): not isolated"
        else
            record "4b 0-GPU escape" ok "ran; job saw ${seen:-no} GPU(s)"
        fi
    else
        record "4b 0-GPU escape" failed
        return 1
    fi
}

step_job_alloc() {
    section "4c. a job holding ${ALLOC_GIB} GiB: NVML per-process VRAM, then cancel"
    if [[ -z $SERVE_PID ]]; then record "4c VRAM + cancel" skipped "no gpuq serve"; return 0; fi
    late "4c VRAM + cancel" && return 0
    if [[ $NODE_GPUS -lt 1 ]]; then record "4c VRAM + cancel" skipped "the node has no GPU"; return 0; fi
    local output="$JOBS_DIR/alloc.out" id pid="" i nvml_pid since
    echo "\$ gpuq submit --parsable --gpus 1 -J alloc -o $output --wrap 'exec $PYTHON $PROBE alloc ...'"
    id=$(cd "$JOBS_DIR" && timeout 30 "${GPUQ[@]}" --home "$HOME_DIR" submit --parsable --gpus 1 \
        -J alloc -o "$output" --wrap "exec $PYTHON $PROBE alloc --gib $ALLOC_GIB --hold $((HOLD_S + 30))" 2>&1)
    echo "    $id"
    if ! [[ $id =~ ^[0-9]+$ ]]; then record "4c VRAM + cancel" failed "submit"; return 1; fi
    JOB_IDS+=("$id")
    for i in $(seq 1 150); do  # up to 30 s for the allocation
        grep -q -e '^ALLOCATED' -e '^no driver' -e '^FAILED' -e 'Error' "$output" 2>/dev/null && break
        sleep 0.2
    done
    sed 's/^/    | /' "$output" 2>/dev/null
    pid=$(sed -n 's/^PID \([0-9]*\)/\1/p' "$output" 2>/dev/null | head -n 1)
    if ! grep -q '^ALLOCATED' "$output" 2>/dev/null; then
        echo "    the job did not allocate (see above)"
        run 15 "${GPUQ[@]}" --home "$HOME_DIR" cancel "$id"
        if grep -q '^no driver' "$output" 2>/dev/null; then
            record "4c VRAM + cancel" skipped "no driver in the job"
            return 0
        fi
        record "4c VRAM + cancel" failed "no allocation"
        return 1
    fi
    sleep 2  # let the agent's next heartbeat carry the usage
    echo "--- NVML, outside the job (job pid $pid)"
    run 20 "$VPY" "$PROBE" procs --match-pid "$pid" --min-bytes $((ALLOC_GIB * 1024 * 1024 * 1024 * 9 / 10)) \
        | tee "$WORK/procs.txt"
    nvml_pid=$(sed -n 's/^ *MATCH \([0-9]*\)$/\1/p' "$WORK/procs.txt" | head -n 1)
    echo "--- gpuq nodes --json: the GPUs' usage as the agent reported it"
    g nodes --json 2>&1 | "$PYTHON" -c '
import json, sys
for node in json.load(sys.stdin):
    for gpu in node.get("gpus", []):
        print("    %s gpu %s %s: allocated %s, memory_used %.0f MiB of %.0f MiB, util %s, jobs %s"
              % (node["name"], gpu.get("index"), gpu.get("uuid"), gpu.get("allocated"),
                 gpu.get("memory_used", 0) / 2**20, gpu.get("memory", 0) / 2**20,
                 gpu.get("utilization"), gpu.get("jobs")))
' 2>&1
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" show "$id"
    echo "--- cancel, then how long NVML keeps listing pid ${nvml_pid:-?}"
    since=$(date +%s.%N)
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" cancel "$id"
    if [[ -n $nvml_pid ]]; then
        if run 40 "$VPY" "$PROBE" forget --pid "$nvml_pid" --since "$since" --interval 0.05 \
            --timeout 30 | tee "$WORK/forget.txt"; then
            record "4c VRAM + cancel" ok "$(sed -n 's/.*FORGOTTEN NVML stopped listing pid [0-9]* \([0-9.]*\) s.*/NVML forgot the pid \1 s after the cancel/p' "$WORK/forget.txt")"
        else
            record "4c VRAM + cancel" failed "NVML still lists the pid"
        fi
    else
        record "4c VRAM + cancel" failed "NVML did not list the job's process"
    fi
    for i in $(seq 1 50); do  # the job's end, up to 10 s
        g show "$id" 2>/dev/null | grep -q -i -E 'cancelled|failed|completed' && break
        sleep 0.2
    done
}

step_records() {
    section "4d. gpuq show / history of these jobs"
    if [[ -z $SERVE_PID || ${#JOB_IDS[@]} -eq 0 ]]; then
        record "4d show/history" skipped "no jobs"
        return 0
    fi
    local id rc=0
    for id in "${JOB_IDS[@]}"; do
        run 15 "${GPUQ[@]}" --home "$HOME_DIR" show "$id" || rc=1
    done
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" history || rc=1
    run 15 "${GPUQ[@]}" --home "$HOME_DIR" history --json | head -n 80
    if [[ $rc -eq 0 ]]; then record "4d show/history" ok; else record "4d show/history" failed; fi
    return "$rc"
}

# ---------------------------------------------------------------- 5. events
step_events() {
    section "5. XID event registration (nvmlEventSetWait_v2, 1 s timeout)"
    if run 60 "$VPY" "$PROBE" events --timeout-ms 1000 | tee "$WORK/events.txt"; then
        if grep -q '^ *no driver' "$WORK/events.txt"; then
            record "5 XID events" ok "no driver"
        else
            record "5 XID events" ok
        fi
    else
        record "5 XID events" failed
        return 1
    fi
}

# ---------------------------------------------------------------- 6. MPS (read-only)
step_mps() {
    section "6. MPS (read-only: nothing is started)"
    echo "\$ pgrep -a nvidia-cuda-mps"
    pgrep -a nvidia-cuda-mps | sed 's/^/    /' || echo "    no MPS control daemon or server running"
    local d
    for d in "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}" "${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"; do
        if [[ -e $d ]]; then
            echo "    $d exists:"
            # shellcheck disable=SC2012  # a listing for a person to read
            ls -la "$d" 2>&1 | head -n 10 | sed 's/^/      /'
        else
            echo "    $d does not exist"
        fi
    done
    echo "    CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY-<unset>}"
    command -v nvidia-cuda-mps-control >/dev/null \
        && echo "    nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control)" \
        || echo "    nvidia-cuda-mps-control: not installed"
    record "6 MPS check" ok
}

# ---------------------------------------------------------------- 7. stop
step_stop() {
    section "7. stop gpuq serve"
    if [[ -z $SERVE_PID ]]; then record "7 stop" skipped "nothing started"; return 0; fi
    if [[ ${#JOB_IDS[@]} -gt 0 ]]; then
        g cancel "${JOB_IDS[@]}" >/dev/null 2>&1
    fi
    kill -TERM "$SERVE_PID" 2>/dev/null
    local i
    for i in $(seq 1 50); do
        kill -0 "$SERVE_PID" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$SERVE_PID" 2>/dev/null; then
        kill -KILL "$SERVE_PID" 2>/dev/null
        record "7 stop" failed "serve ignored SIGTERM for 10 s; killed"
    else
        wait "$SERVE_PID" 2>/dev/null
        echo "    gpuq serve stopped (exit $?) after $((i / 5)) s"
        record "7 stop" ok
    fi
    echo "--- serve log (last 25 lines)"
    tail -n 25 "$WORK/serve.log" | sed 's/^/    | /'
    SERVE_PID=""
}

# the cgroup layout jobs get (issue 24), and the doctor's cgroup checks on it; read-only (the
# device-program probe loads a trivial program and closes it: nothing is attached)
step_cgroups() {
    section "1b. cgroups: layout, the jobs' subtree, delegation, device control"
    echo "--- cgroup mounts"
    grep -E ' cgroup2? ' /proc/self/mounts | sed 's/^/    /'
    echo "--- this shell's cgroup (an agent started here would have it)"
    sed 's/^/    /' /proc/self/cgroup
    local pid
    pid=$(systemctl show -p MainPID --value gpuq-agent.service 2>/dev/null || true)
    if [[ -n $pid && $pid != 0 ]]; then
        echo "--- gpuq-agent.service (pid $pid) cgroup"
        sed 's/^/    /' "/proc/$pid/cgroup"
    fi
    local v2 parent r
    v2=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)
    parent=$("$VPY" -c 'from gpuq.config.loading import load_settings as l; print(l().agent.cgroup_parent)' 2>/dev/null \
        || echo "system.slice/gpuq-jobs.service")
    echo "    run from $(id -un); systemd: $([[ -d /run/systemd/system ]] && echo yes || echo no); cgroup_parent: $parent"
    if [[ -n $v2 ]]; then
        echo "--- $v2: cgroup.controllers: $(cat "$v2/cgroup.controllers" 2>/dev/null)"
        echo "    cgroup.subtree_control: $(cat "$v2/cgroup.subtree_control" 2>/dev/null)"
        r="$v2/${parent#/}"
        if [[ -d $r ]]; then
            echo "--- R = $r"
            echo "    cgroup.controllers: $(cat "$r/cgroup.controllers" 2>/dev/null)"
            echo "    cgroup.subtree_control: $(cat "$r/cgroup.subtree_control" 2>/dev/null)"
            echo "    cgroup.procs (R's own: empty once the agent moved them to holder): $(tr '\n' ' ' <"$r/cgroup.procs" 2>/dev/null)"
            echo "    children: $(find "$r" -mindepth 1 -maxdepth 2 -type d -printf '%P ' 2>/dev/null)"
            echo "    trusted.delegate: $("$PYTHON" -c 'import os,sys
try: print(os.getxattr(sys.argv[1], "trusted.delegate").decode())
except OSError as e: print("none (%s)" % (e.strerror,))' "$r")"
        else
            echo "    R = $r does not exist (no gpuq-jobs.service here, or not running)"
        fi
    fi
    echo "--- gpuq's doctor, cgroup checks"
    if run 30 "$VPY" -c '
import sys
from gpuq.admin.checks import DoctorContext
from gpuq.admin.doctor_cgroups import cgroup_checks
from gpuq.config.loading import load_settings
checks = cgroup_checks(DoctorContext(load_settings()))
for c in checks:
    print(f"{c.status:5} {c.name}: {c.detail}" + (f"\n      fix: {c.fix}" if c.fix else ""))
sys.exit(1 if any(c.status == "fail" for c in checks) else 0)
'; then
        record "1b cgroups" ok
    else
        record "1b cgroups" failed "a cgroup check failed: see its fix"
    fi
}

# each step in turn; a failed one never stops the run. The forget figure goes to a file too.
step_install
step_cgroups
step_nvml
step_serve
step_job_gpu
step_job_escape
step_job_alloc
step_records
step_events
step_mps
step_stop

section "summary"
failed=0
for step in "${STEPS[@]}"; do
    printf '  %-20s %s\n' "$step" "${RESULT[$step]}"
    [[ ${RESULT[$step]} == failed* ]] && failed=1
done
grep -h -e 'FORGOTTEN' -e 'NVML lag' "$WORK/forget.txt" 2>/dev/null | sed 's/^ */  /'
echo "  total $((SECONDS - START)) s"
exit "$failed"
