#!/usr/bin/env bash
# A real, single-machine Slurm cluster (Debian's slurmctld/slurmd/munge packages) for the
# portal's tests and benchmarks. Everything it owns lives under $SLURM_DIR, so it never touches
# /etc/slurm, /run/munge or a system-wide munged, and several clusters can coexist as long as
# their SLURM_DIR and SLURM_PORT_BASE differ.
#
#   bash scripts/slurm_up.sh start             # bring the cluster up; last stdout line: export SLURM_CONF=...
#       If a cluster with the same settings is already up (every node idle/mixed/allocated), it
#       is reused as it is. Otherwise whatever is there is stopped and a fresh cluster starts:
#       empty state (job ids from 1 again), empty jobcomp log.
#   bash scripts/slurm_up.sh stop              # kill every daemon and job process of this SLURM_DIR
#   bash scripts/slurm_up.sh status            # sinfo (exit 1 when the controller does not answer)
#   bash scripts/slurm_up.sh stop-controller   # stop only slurmctld: slurmd's and their jobs keep running
#   bash scripts/slurm_up.sh start-controller  # start slurmctld again, recovering its saved state
#   bash scripts/slurm_up.sh stop-node I       # crash node I: SIGKILL its slurmd and its jobs' processes,
#                                              # then mark it DOWN (its jobs end NODE_FAIL at once)
#   bash scripts/slurm_up.sh start-node I      # start node I's slurmd again, resume it, wait until it is up
#
# Settings, from the environment:
#   SLURM_DIR        /tmp/gpu-portal-slurm  config, state, spool, logs, pid files, munge key + socket
#   SLURM_NODES      4                      nodes node1..nodeN, each its own slurmd on this host
#   SLURM_GPUS       8                      GPUs per node (fake device files)
#   SLURM_GRES_TYPE  h100                   empty string: typeless GRES (gpu:8)
#   SLURM_CPUS       16                     CPUs each node claims, whatever the machine really has
#   SLURM_MEM_MB     65536                  RealMemory each node claims
#   SLURM_PORT_BASE  16817                  slurmctld port; node I's slurmd listens on BASE+I
#   SLURM_CLUSTER    portaltest
#   SLURM_PARTITION  gpu
#   SLURM_START_TIMEOUT 60                  seconds to wait for all nodes to be idle
#   SLURM_RETURN_TO_SERVICE 1               slurm.conf ReturnToService (see the note there)
#   SLURM_SLURMD_TIMEOUT 30                 SlurmdTimeout; a node whose slurmd died goes DOWN ~15 s after it
#   SLURM_MIN_JOB_AGE 300                   MinJobAge: how long squeue still lists an ended job
#
# Client commands must run with SLURM_CONF=$SLURM_DIR/slurm.conf in their environment.
set -euo pipefail

SLURM_DIR=${SLURM_DIR:-/tmp/gpu-portal-slurm}
SLURM_NODES=${SLURM_NODES:-4}
SLURM_GPUS=${SLURM_GPUS:-8}
SLURM_GRES_TYPE=${SLURM_GRES_TYPE-h100}
SLURM_CPUS=${SLURM_CPUS:-16}
SLURM_MEM_MB=${SLURM_MEM_MB:-65536}
SLURM_PORT_BASE=${SLURM_PORT_BASE:-16817}
SLURM_CLUSTER=${SLURM_CLUSTER:-portaltest}
SLURM_PARTITION=${SLURM_PARTITION:-gpu}
SLURM_START_TIMEOUT=${SLURM_START_TIMEOUT:-60}
SLURM_RETURN_TO_SERVICE=${SLURM_RETURN_TO_SERVICE:-1}
SLURM_SLURMD_TIMEOUT=${SLURM_SLURMD_TIMEOUT:-30}
SLURM_MIN_JOB_AGE=${SLURM_MIN_JOB_AGE:-300}

# Relative paths would break as soon as a daemon chdir()s, and callers run us from anywhere.
case $SLURM_DIR in /*) ;; *) SLURM_DIR="$PWD/$SLURM_DIR" ;; esac
SLURM_DIR=${SLURM_DIR%/}

CONF="$SLURM_DIR/slurm.conf"
# Slurm reads gres.conf from the directory of slurm.conf; there is no setting for it.
GRES_CONF="$SLURM_DIR/gres.conf"
MUNGE_DIR="$SLURM_DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY="$MUNGE_DIR/munge.key"
MUNGE_PID="$MUNGE_DIR/munged.pid"
LOG_DIR="$SLURM_DIR/log"
RUN_DIR="$SLURM_DIR/run"
STATE_DIR="$SLURM_DIR/state"
SPOOL_DIR="$SLURM_DIR/spool"
DEV_DIR="$SLURM_DIR/dev"
CTLD_PID="$RUN_DIR/slurmctld.pid"
# Every daemon we start carries this variable, and the slurmstepd's they fork inherit it: that
# is how `stop` finds exactly this cluster's processes and no one else's (pid files can go stale).
MARK="GPU_PORTAL_SLURM_DIR=$SLURM_DIR"
# Likewise each slurmd, and so its slurmstepd's, carries the name of its node.
node_mark() { echo "GPU_PORTAL_SLURM_NODE=$SLURM_DIR:$1"; }

export SLURM_CONF="$CONF"
# The client commands must never fall back to a system-wide configuration or munged.
unset SLURM_CONF_SERVER 2>/dev/null || true

# Set while `start` runs: a half-started cluster is torn down again rather than left behind
# (the logs stay, for the error message and for whoever looks afterwards).
STARTING=""

die() {
  echo "slurm_up: $*" >&2
  if [ -n "$STARTING" ]; then
    STARTING=""
    cmd_stop >/dev/null 2>&1 || true
  fi
  exit 1
}
say() { echo "slurm_up: $*" >&2; }

# Show why a daemon failed: its own log plus whatever it wrote on stderr before it had a log.
show_log() {
  local f
  for f in "$@"; do
    if [ -s "$f" ]; then
      echo "----- last lines of $f -----" >&2
      tail -n 25 "$f" >&2
    fi
  done
}

ensure_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sinfo >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} (apt-get)"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # The packages' postinst scripts may start the system-wide services; we neither use nor
  # disturb them (our daemons have their own config, ports and munge socket).
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge >&2 ||
    { $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge >&2; }
}

# --- processes --------------------------------------------------------------------------------

# A pid counts as ours only if it is alive and carries our marker: a pid file left by a crashed
# run may name a pid that the kernel has since given to an unrelated process.
is_ours() {
  local pid=$1
  [ -n "$pid" ] || return 1
  grep -qzxF "${2:-$MARK}" "/proc/$pid/environ" 2>/dev/null
}

pid_from() { [ -s "$1" ] && tr -dc '0-9' <"$1" || true; }

# All processes carrying the marker ($1, default: this cluster's), plus all their descendants
# (the job scripts, which get the job's environment, not the daemon's, so the marker alone
# would miss them). Without $1 also batch scripts orphaned by a slurmstepd killed by hand:
# they run from our spool directory.
our_pids() {
  local p roots=()
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = "$$" ] && continue
    if is_ours "$p" "${1:-$MARK}"; then
      roots+=("$p")
    elif [ -z "${1:-}" ] && tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF "$SPOOL_DIR/"; then
      roots+=("$p")
    fi
  done
  [ ${#roots[@]} -eq 0 ] && return 0
  ps -e -o pid=,ppid= | awk -v roots="${roots[*]}" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2; pids[NR] = $1 }
    END {
      changed = 1
      while (changed) {
        changed = 0
        for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 } }
      }
      for (p in keep) print p
    }'
}

# Pids of our processes whose command name is $1 (slurmd, slurmstepd, slurmctld, munged).
our_pids_named() {
  local p comm
  for p in $(our_pids); do
    comm=$(cat "/proc/$p/comm" 2>/dev/null || true)
    [ "$comm" = "$1" ] && echo "$p"
  done
  return 0
}

# TERM, wait up to $2 seconds, then KILL whatever is left.
kill_and_wait() {
  local pids=$1 secs=${2:-10} p alive i
  [ -z "$pids" ] && return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    alive=""
    for p in $pids; do [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && alive+="$p "; done
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $alive 2>/dev/null || true
  sleep 0.2
}

# --- configuration ----------------------------------------------------------------------------

# The node's Gres= setting, with its leading space; nothing for GPU-less nodes.
gres_spec() {
  [ "$SLURM_GPUS" -gt 0 ] || return 0
  if [ -n "$SLURM_GRES_TYPE" ]; then echo " Gres=gpu:$SLURM_GRES_TYPE:$SLURM_GPUS"; else echo " Gres=gpu:$SLURM_GPUS"; fi
}

write_config() {
  local out=$1 i nodes="node[1-$SLURM_NODES]"
  [ "$SLURM_NODES" -eq 1 ] && nodes=node1
  {
    cat <<EOF
# Generated by scripts/slurm_up.sh; rewritten on every start.
ClusterName=$SLURM_CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$SLURM_PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Without this the Debian default (/etc/slurm/plugstack.conf) would be read.
PlugStackConfig=$SLURM_DIR/plugstack.conf
# No cgroups here (and none needed): plain process groups and no CPU binding.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
# Debian has no mail program installed by default; slurmctld complains at every start.
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# (AccountingStorageTRES=gres/gpu would put GPUs in CfgTRES/AllocTRES, but slurmctld 22.05
# refuses it without slurmdbd.)
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
# No slurmdbd: finished jobs are only known from the jobcomp file (and, for MinJobAge
# seconds, from scontrol show job).
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_DIR/jobcomp.log
# A job on a node that fails ends as NODE_FAIL instead of being silently requeued.
JobRequeue=0
KillWait=2
MinJobAge=$SLURM_MIN_JOB_AGE
InactiveLimit=0
# Short timeouts so that clients fail fast when slurmctld is down and dead nodes are noticed.
MessageTimeout=5
SlurmctldTimeout=30
SlurmdTimeout=$SLURM_SLURMD_TIMEOUT
# 1: a node that went DOWN because its slurmd stopped answering comes back by itself when
# the slurmd registers again, while "scontrol update state=down" sticks until state=resume.
# With 2, even an admin-set DOWN node is idle again at its next registration (within a
# second for a busy node, a few seconds for an idle one), which makes DOWN untestable.
ReturnToService=$SLURM_RETURN_TO_SERVICE
# The nodes claim more CPUs/memory than this machine has; without config_overrides slurmd
# would report the real hardware and the controller would drain the nodes.
SlurmdParameters=config_overrides
EOF
    # Every node is its own slurmd on this host, told apart by its port (Debian builds slurmd
    # with multiple-slurmd support: slurmd -N nodeI).
    for ((i = 1; i <= SLURM_NODES; i++)); do
      echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((SLURM_PORT_BASE + i)) CPUs=$SLURM_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$SLURM_CPUS ThreadsPerCore=1 RealMemory=$SLURM_MEM_MB$(gres_spec) State=UNKNOWN"
    done
    echo "PartitionName=$SLURM_PARTITION Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$out"
}

write_gres_config() {
  local out=$1 type="" nodes="node[1-$SLURM_NODES]"
  [ "$SLURM_NODES" -eq 1 ] && nodes=node1
  [ -n "$SLURM_GRES_TYPE" ] && type=" Type=$SLURM_GRES_TYPE"
  local files="$DEV_DIR/nvidia0"
  [ "$SLURM_GPUS" -gt 1 ] && files="$DEV_DIR/nvidia[0-$((SLURM_GPUS - 1))]"
  if [ "$SLURM_GPUS" -gt 0 ]; then
    echo "NodeName=$nodes Name=gpu$type File=$files" >"$out"
  else
    : >"$out"
  fi
}

# --- state checks -----------------------------------------------------------------------------

ctld_alive() { is_ours "$(pid_from "$CTLD_PID")"; }
munged_alive() { is_ours "$(pid_from "$MUNGE_PID")" && [ -S "$MUNGE_SOCKET" ]; }
slurmd_alive() { is_ours "$(pid_from "$RUN_DIR/slurmd-node$1.pid")"; }

# Node states from sinfo as "name state" lines; nothing when the controller does not answer.
node_states() { timeout 15 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true; }

# $1: extended regex the node states must match. True when all SLURM_NODES nodes do. "unknown"
# (not registered yet) and a trailing "*" (not responding) never match.
all_nodes_in() {
  local states
  states=$(node_states)
  [ "$(echo "$states" | grep -v ' unknown' | grep -cE "^node[0-9]+ ($1)\$" || true)" -eq "$SLURM_NODES" ]
}

cluster_up() {
  munged_alive && ctld_alive || return 1
  local i
  for ((i = 1; i <= SLURM_NODES; i++)); do slurmd_alive "$i" || return 1; done
  # Busy nodes are fine (a test may reuse a cluster with jobs on it); drained or down ones are not.
  all_nodes_in 'idle|mixed|allocated|completing'
}

# --- starting ---------------------------------------------------------------------------------

start_munged() {
  if [ ! -s "$MUNGE_KEY" ]; then
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile="$MUNGE_KEY" >/dev/null 2>&1 || dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    else
      dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
  fi
  chmod 0400 "$MUNGE_KEY"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  # --force: munged otherwise refuses some root-owned setups (e.g. a world-writable /tmp above us).
  env "$MARK" munged --force --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" --pid-file="$MUNGE_PID" \
    --log-file="$LOG_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed" \
    </dev/null >>"$LOG_DIR/munged.out" 2>&1 ||
    { show_log "$LOG_DIR/munged.out" "$LOG_DIR/munged.log"; die "munged failed to start"; }
  local i
  for ((i = 0; i < 100; i++)); do
    if [ -S "$MUNGE_SOCKET" ] && munge -S "$MUNGE_SOCKET" -n 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  show_log "$LOG_DIR/munged.out" "$LOG_DIR/munged.log"
  die "munged did not answer on $MUNGE_SOCKET"
}

# slurmctld without -c: it recovers jobs and node states from StateSaveLocation.
start_ctld() {
  env "$MARK" slurmctld -f "$CONF" </dev/null >>"$LOG_DIR/slurmctld.out" 2>&1 ||
    { show_log "$LOG_DIR/slurmctld.out" "$LOG_DIR/slurmctld.log"; die "slurmctld failed to start"; }
  local i
  for ((i = 0; i < 150; i++)); do
    if timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then return 0; fi
    if [ $i -gt 10 ] && ! ctld_alive; then break; fi
    sleep 0.1
  done
  show_log "$LOG_DIR/slurmctld.out" "$LOG_DIR/slurmctld.log"
  die "slurmctld did not come up (log: $LOG_DIR/slurmctld.log)"
}

start_slurmds() {
  local i
  for ((i = 1; i <= SLURM_NODES; i++)); do
    slurmd_alive "$i" && continue
    mkdir -p "$SPOOL_DIR/node$i"
    env "$MARK" "$(node_mark "node$i")" slurmd -N "node$i" -f "$CONF" </dev/null >>"$LOG_DIR/slurmd-node$i.out" 2>&1 ||
      { show_log "$LOG_DIR/slurmd-node$i.out" "$LOG_DIR/slurmd-node$i.log"; die "slurmd for node$i failed to start"; }
  done
}

wait_nodes_idle() {
  local deadline=$((SECONDS + SLURM_START_TIMEOUT)) i
  while [ $SECONDS -lt $deadline ]; do
    all_nodes_in 'idle' && return 0
    for ((i = 1; i <= SLURM_NODES; i++)); do
      if ! slurmd_alive "$i" && [ -s "$RUN_DIR/slurmd-node$i.pid" ]; then
        show_log "$LOG_DIR/slurmd-node$i.out" "$LOG_DIR/slurmd-node$i.log"
        die "slurmd for node$i died"
      fi
    done
    ctld_alive || { show_log "$LOG_DIR/slurmctld.out" "$LOG_DIR/slurmctld.log"; die "slurmctld died"; }
    sleep 0.2
  done
  echo "----- sinfo -----" >&2
  timeout 10 sinfo -N -o '%N %T %E' >&2 || true
  show_log "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd-node1.log"
  die "nodes not all idle after ${SLURM_START_TIMEOUT}s"
}

# Another cluster (or anything else) on our ports would make a daemon die with a terse
# "Address already in use" in its log; say so plainly instead.
check_ports_free() {
  local port
  for ((port = SLURM_PORT_BASE; port <= SLURM_PORT_BASE + SLURM_NODES; port++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port is already in use (another cluster? choose another SLURM_PORT_BASE)"
    fi
  done
}

cmd_start() {
  ensure_packages
  mkdir -p "$SLURM_DIR"
  local want
  want=$(mktemp)
  write_config "$want"
  write_gres_config "$want.gres"
  # Reuse a running cluster only if it was started with the same settings.
  if cmp -s "$want" "$CONF" && cmp -s "$want.gres" "$GRES_CONF" && cluster_up; then
    rm -f "$want" "$want.gres"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  # Anything half-up or stale (dead daemons, other settings) is thrown away: a fresh start is
  # cheaper than working out what survived, and old job ids in the state dir or the jobcomp log
  # would confuse a portal that starts with an empty database.
  cmd_stop >/dev/null
  STARTING=1
  rm -rf "$STATE_DIR" "$SPOOL_DIR" "$RUN_DIR" "$LOG_DIR" "$DEV_DIR" "$MUNGE_DIR" "$SLURM_DIR/jobcomp.log"
  mkdir -p "$STATE_DIR" "$SPOOL_DIR" "$RUN_DIR" "$LOG_DIR" "$DEV_DIR" "$MUNGE_DIR"
  # munged insists that nobody else can write where its key, socket and logs are, and that
  # everyone can reach its socket.
  chmod 0755 "$SLURM_DIR" "$LOG_DIR" "$MUNGE_DIR"
  mv "$want" "$CONF"
  mv "$want.gres" "$GRES_CONF"
  : >"$SLURM_DIR/plugstack.conf"
  # Fake GPUs: clones of /dev/null, so that a job that opens one gets a harmless device.
  local g
  for ((g = 0; g < SLURM_GPUS; g++)); do
    mknod "$DEV_DIR/nvidia$g" c 1 3 2>/dev/null || : >"$DEV_DIR/nvidia$g"
  done
  check_ports_free
  start_munged
  start_ctld
  start_slurmds
  wait_nodes_idle
  STARTING=""
  echo "export SLURM_CONF=$CONF"
}

# --- stopping ---------------------------------------------------------------------------------

cmd_stop() {
  # slurmd's first, so that nothing launches new steps; then the controller, before the job
  # processes die, otherwise it spends seconds trying to tell the dead slurmd's about every
  # job that ends; then the job steps and processes (with proctrack/pgid they outlive slurmd);
  # munged last, since the others talk to it while shutting down.
  kill_and_wait "$(our_pids_named slurmd)" 10
  kill_and_wait "$(our_pids_named slurmctld)" 15
  # Test jobs that trap TERM get a second, then KILL: this is a teardown.
  local p jobs=""
  for p in $(our_pids); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null || true)" = munged ] || jobs+="$p "
  done
  kill_and_wait "$jobs" 1
  kill_and_wait "$(our_pids | tr '\n' ' ')" 5
  rm -f "$CTLD_PID" "$RUN_DIR"/slurmd-*.pid "$MUNGE_PID" "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" 2>/dev/null || true
  echo "slurm_up: stopped cluster in $SLURM_DIR"
}

cmd_stop_controller() {
  local pid
  pid=$(pid_from "$CTLD_PID")
  is_ours "$pid" || { say "slurmctld is not running"; return 0; }
  # TERM makes slurmctld save its state before exiting.
  kill_and_wait "$pid" 30
  echo "slurm_up: slurmctld stopped"
}

cmd_start_controller() {
  [ -f "$CONF" ] || die "no cluster configured in $SLURM_DIR (run start first)"
  munged_alive || die "munged of $SLURM_DIR is not running (run start)"
  if ! ctld_alive; then
    start_ctld
    # Until each slurmd has re-registered, nodes show "unknown" and GRES use without indices;
    # give them a moment, but a node whose slurmd is gone must not block us.
    local deadline=$((SECONDS + 15))
    while [ $SECONDS -lt $deadline ] && ! all_nodes_in '[a-z]+'; do sleep 0.2; done
  fi
  echo "export SLURM_CONF=$CONF"
}

node_arg() {
  local i=${1:-}
  i=${i#node}
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$SLURM_NODES" ] ||
    die "expected a node number 1..$SLURM_NODES (or node1..node$SLURM_NODES), got '${1:-}'"
  echo "$i"
}

# A crash, not a shutdown: no job gets a chance to clean up. Left alone, slurmctld would only
# notice through missed pings (node "*" after ~20 s, DOWN and its jobs NODE_FAIL after ~40 s
# with SlurmdTimeout=30), and a slurmd restarted before that would leave the killed jobs
# RUNNING for ever: the host did not reboot, so slurmctld does not purge them. Marking the
# node DOWN at once makes the outcome immediate and certain.
cmd_stop_node() {
  local i pids
  i=$(node_arg "${1:-}")
  pids=$(our_pids "$(node_mark "node$i")" | tr '\n' ' ')
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
  else
    say "node$i had no running slurmd"
  fi
  rm -f "$RUN_DIR/slurmd-node$i.pid"
  timeout 15 scontrol update nodename="node$i" state=down reason="slurm_up stop-node" ||
    say "could not mark node$i DOWN (is slurmctld up?); it will go DOWN when it misses its pings"
  echo "slurm_up: node$i killed"
}

cmd_start_node() {
  local i state deadline
  i=$(node_arg "${1:-}")
  [ -f "$CONF" ] || die "no cluster configured in $SLURM_DIR (run start first)"
  if ! slurmd_alive "$i"; then
    env "$MARK" "$(node_mark "node$i")" slurmd -N "node$i" -f "$CONF" </dev/null >>"$LOG_DIR/slurmd-node$i.out" 2>&1 ||
      { show_log "$LOG_DIR/slurmd-node$i.out" "$LOG_DIR/slurmd-node$i.log"; die "slurmd for node$i failed to start"; }
  fi
  deadline=$((SECONDS + 20))
  while [ $SECONDS -lt $deadline ]; do
    state=$(timeout 15 sinfo -h -N -n "node$i" -o '%T' 2>/dev/null | head -n 1 || true)
    case $state in
      idle | mixed | allocated | completing)
        echo "slurm_up: node$i is $state"
        return 0
        ;;
      # Registered but still DOWN (set by stop-node or by hand; ReturnToService=1 keeps it so).
      down | drained) timeout 15 scontrol update nodename="node$i" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.2
  done
  die "node$i is '${state:-?}' after 20 s (log: $LOG_DIR/slurmd-node$i.log)"
}

cmd_status() {
  [ -f "$CONF" ] || die "no cluster configured in $SLURM_DIR"
  timeout 15 sinfo -N -o '%N %P %T %G %E'
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  stop-controller) cmd_stop_controller ;;
  start-controller) cmd_start_controller ;;
  stop-node) cmd_stop_node "${2:-}" ;;
  start-node) cmd_start_node "${2:-}" ;;
  *)
    echo "usage: $0 start|stop|status|stop-controller|start-controller|stop-node I|start-node I  (settings via env, see the header)" >&2
    exit 2
    ;;
esac
