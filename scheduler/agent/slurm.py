"""A Slurm cluster, as the connector (`gpu-agent slurm`) sees it: through Slurm's own client
commands (`sinfo`, `squeue`, `scontrol`, `sbatch`, `scancel`), which find the cluster as they
always do (`SLURM_CONF`, or the host's configuration).

The commands rather than slurmrestd: they are on every host that can submit jobs, take the
same options and print the same formats on every Slurm version the connector meets (slurmrestd
is an extra daemon, often not run, and its API versions come and go with Slurm's), and they
need no credentials of their own (munge, as every Slurm user). Each call is a process of a few
milliseconds: the connector makes a few a second, however many jobs run.

Every parser here is a pure function over the text a command prints, tested on Slurm's own
output (tests/agent/test_slurm_parsing.py) and live (tests/slurm/)."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from scheduler.agent.cluster import ClusterRefused, ClusterUnreachable, shell_line
from scheduler.agent.core import FileRetention, log_tail
from scheduler.agent.protocol import (
    END_EXIT,
    END_LOST,
    END_TIMEOUT,
    NODE_DOWN,
    NODE_DRAINING,
    NODE_READY,
    WORKING_DIR_MISSING,
)

logger = logging.getLogger("scheduler.agent.slurm")

COMMAND_TIMEOUT_SECONDS = 30.0
# How long after a one-node job is seen running the connector waits for its batch script's
# record of its GPUs before asking slurmctld (the script starts a moment after squeue says R).
GPUS_RECORD_WAIT_SECONDS = 1.0
# A GPU record nobody read (it came after scontrol was asked: a slow shared file system) is
# removed this long after it was written.
STALE_GPUS_RECORD_SECONDS = 3600.0
# The fields of `sinfo -N -O` and `squeue -O` the connector reads, each ending with the
# separator: Slurm pads no field that has a suffix of its own.
SEP = "|"
SINFO_FIELDS = ("NodeList", "Partition", "StateLong", "Gres", "GresUsed", "Reason")
SQUEUE_FIELDS = ("JobID", "Name", "State", "Reason", "NodeList", "tres-per-node", "exit_code",
                 "Partition", "UserName")  # fmt: skip
# What each job state Slurm prints means to the portal. squeue, sacct and scontrol print one
# word for a job (job_state_string in src/common/slurm_protocol_defs.c): its first state flag
# that has a name there, else its base state (squeue(1) "JOB STATE CODES",
# doc/html/job_state_codes.shtml). The job is pending (not started: the connector waits
# --pending-timeout, then cancels it and the portal requeues it, withdrawn; one that ran and
# is pending again was requeued by Slurm, and is lost), holding its nodes' GPUs (it runs, or
# is stopped, suspended or finishing), or ended, in the protocol's words: its process exited
# (with its exit code; a cancel after SIGTERM is the exit of a stopped job), ran out of time,
# or was lost with its node (the portal runs it again).
JOB_PENDING = "pending"
JOB_HOLDING = "holding"
JOB_STATES = {
    "PENDING": JOB_PENDING,
    "CONFIGURING": JOB_PENDING,  # its nodes are booting (powered down ones: POWER_UP_NODE)
    "POWER_UP_NODE": JOB_PENDING,
    "EXPEDITING": JOB_PENDING,  # requeued, to be scheduled before any other
    "REQUEUED": JOB_PENDING, "REQUEUE_FED": JOB_PENDING, "REQUEUE_HOLD": JOB_PENDING,
    "RESV_DEL_HOLD": JOB_PENDING,  # held: its reservation was deleted
    # Requeue flags, not printed as states (slurm/slurm.h): requeued, held, after its launch
    # (its prolog) or its nodes' reconfiguration failed.
    "LAUNCH_FAILED": JOB_PENDING, "RECONFIG_FAIL": JOB_PENDING,
    "RUNNING": JOB_HOLDING, "SUSPENDED": JOB_HOLDING, "STOPPED": JOB_HOLDING,
    "SIGNALING": JOB_HOLDING, "RESIZING": JOB_HOLDING,
    # Its processes have ended; its epilog, or its burst buffer's stage-out, has not.
    "COMPLETING": JOB_HOLDING, "STAGE_OUT": JOB_HOLDING,
    "COMPLETED": END_EXIT, "FAILED": END_EXIT, "CANCELLED": END_EXIT, "OUT_OF_MEMORY": END_EXIT,
    # Ended, and requeued held by the site's EpilogSlurmctld: still in Slurm's queue
    # (SlurmJob.queued), where the connector cancels it.
    "SPECIAL_EXIT": END_EXIT,
    "TIMEOUT": END_TIMEOUT, "DEADLINE": END_TIMEOUT,
    "NODE_FAIL": END_LOST, "BOOT_FAIL": END_LOST, "PREEMPTED": END_LOST, "REVOKED": END_LOST,
}  # fmt: skip
# Ended, and still in Slurm's queue: an operator's release would run them again.
REQUEUED_ENDS = frozenset(("SPECIAL_EXIT",))
# Holding its nodes only while its epilog or stage-out runs: nothing left to cancel.
ENDING_STATES = frozenset(("COMPLETING", "STAGE_OUT"))
_unknown_job_states: set[str] = set()  # logged once each


def job_state_meaning(state: str, *, has_nodes: bool) -> str:
    """What a Slurm job's `state` means to the portal: JOB_PENDING, JOB_HOLDING or an END_*
    (JOB_STATES). A state the table does not have ("?", Slurm's word for a base state it does
    not know; a flag of a newer Slurm; UPDATE_DB) is never taken for an end, and never leaves
    the attempt in between: a job that has its nodes holds them, one that has none is pending
    (and withdrawn at the pending timeout). Such a state is logged, once."""
    meaning = JOB_STATES.get(state)
    if meaning is None:
        meaning = JOB_HOLDING if has_nodes else JOB_PENDING
        if state not in _unknown_job_states:
            _unknown_job_states.add(state)
            logger.warning("Slurm job state %r is not one the connector knows; read as %s",
                           state, meaning)  # fmt: skip
    return meaning


class SlurmUnreachable(ClusterUnreachable):
    """A Slurm command did not get an answer from slurmctld (or could not run at all)."""


class SlurmRefused(ClusterRefused):
    """slurmctld answered, and refused (sbatch: a bad request for this cluster)."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    partitions: tuple[str, ...]
    gpu_type: str | None  # None: the GRES has no type
    gpus: int
    used_gpus: int
    state: str  # the portal's: NODE_READY, NODE_DRAINING or NODE_DOWN
    reason: str  # Slurm's state and reason, as an operator reads them


@dataclass(frozen=True)
class SlurmJob:
    id: str
    name: str
    state: str  # Slurm's, e.g. RUNNING
    reason: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    exit_code: int | None  # the batch script's; -N: killed by signal N (as Popen says)
    partition: str
    user: str = ""  # who submitted it (squeue's UserName; not known to sacct's and jobcomp's)

    @property
    def pending(self) -> bool:
        return job_state_meaning(self.state, has_nodes=bool(self.nodes)) == JOB_PENDING

    @property
    def holding(self) -> bool:
        return job_state_meaning(self.state, has_nodes=bool(self.nodes)) == JOB_HOLDING

    @property
    def end(self) -> str | None:
        """How the job ended, in the protocol's words; None while it has not."""
        meaning = job_state_meaning(self.state, has_nodes=bool(self.nodes))
        return None if meaning in (JOB_PENDING, JOB_HOLDING) else meaning

    @property
    def queued(self) -> bool:
        """Whether Slurm may still run it: it waits (pending, held, requeued), runs, or ended
        and was requeued held (REQUEUED_ENDS). Not a job whose epilog runs (ENDING_STATES)."""
        if self.state in REQUEUED_ENDS:
            return True
        return self.pending or (self.holding and self.state not in ENDING_STATES)


# --- Parsers -----------------------------------------------------------------------------------


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact node lists, as `scontrol show hostnames` expands them: "node[1-3,7]",
    "a1,b[01-02]", "gpu-[1-2]-x"."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        if not part:
            continue
        match = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        head, ranges, tail = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                suffixes = [low]
            else:
                width = len(low) if low.startswith("0") else 0
                suffixes = [str(i).zfill(width) for i in range(int(low), int(high) + 1)]
            for suffix in suffixes:
                names.extend(expand_hostlist(f"{head}{suffix}{tail}"))
    return names


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _gres_gpus(gres: str) -> list[tuple[str | None, int]]:
    """The GPU entries of a GRES string: "gpu:h100:8(S:0-1)" → [("h100", 8)]; "gpu:8" →
    [(None, 8)]; "gpu:h100:2(IDX:0-1),shard:4" → [("h100", 2)]; "(null)" → []."""
    entries = []
    for entry in _split_top(gres.replace("(", "[").replace(")", "]")):
        fields = entry.split("[", 1)[0].split(":")
        if not fields or fields[0] != "gpu":
            continue
        if len(fields) == 2 and fields[1].isdigit():
            entries.append((None, int(fields[1])))
        elif len(fields) >= 3 and fields[2].isdigit():
            entries.append((fields[1], int(fields[2])))
        elif len(fields) == 2:  # a type and no count: one
            entries.append((fields[1], 1))
    return entries


# What each word of sinfo's StateLong means to the portal: node_state_string (src/common/
# slurm_protocol_defs.c) lowercased, a base state or a flag that stands for it, and a suffix
# for more flags (sinfo(1), NODE STATE CODES). READY: Slurm starts jobs there now ("completing":
# its jobs' epilogs run, for seconds; "planned", "mixed-": the backfill scheduler's plan, remade
# every cycle, puts a pending job there later, and its GPUs are free now; "reserved": idle in an
# advanced reservation, which the portal's jobs may be given with --sbatch-arg=--reservation=...).
# Where Slurm then keeps a portal job pending, the pending timeout withdraws it, with Slurm's
# reason.
READY_WORDS = frozenset(("idle", "mixed", "allocated", "completing", "planned", "reserved"))
# DRAINING: no new jobs, and those it runs go on. "blocked": idle, kept out by another job's
# exclusive topology block; "perfctrs": idle, its network performance counters in use by
# another job (Cray, before Slurm 24.05).
DRAINING_WORDS = frozenset(("drain", "drained", "draining", "drng", "maint", "reboot",
                            "reboot_requested", "reboot_issued", "blocked",
                            "perfctrs"))  # fmt: skip
# DOWN: not usable. "fail"/"failing": an operator says it is about to fail; "future": not yet
# configured; "inval": registered with less than its configuration; the power-saving states
# (powered down, powering up or down), which only a job's start or an operator ends: the portal
# promises a start within its pending timeout, and a node that must boot first cannot keep it;
# "unknown", "?" and any word not in these tables (logged once): a node is offered only in a
# state known to take jobs.
DOWN_WORDS = frozenset(("down", "fail", "failing", "future", "unknown", "inval", "noresp",
                        "not_responding", "powered", "powered_down", "powering_down",
                        "powering_up", "power_down", "power_up", "dynamic_future", "undrain",
                        "cancel_reboot", "resume", "?", "n/a"))  # fmt: skip
# Flags that say nothing of whether it takes jobs (as scontrol writes a node's flags,
# "idle+cloud"): alone, a node is not READY.
NEUTRAL_WORDS = frozenset(("cloud", "dynamic_norm", "external"))
# StateLong's suffixes: "*" not responding, "~" powered off, "#" powering up or being
# configured, "%" powering down.
DOWN_SUFFIXES = frozenset("*~#%")
# Of a node that takes no new jobs while those it runs go on: "$" in a maintenance reservation
# (as MAINT), "^" its reboot issued, "!" pending power down (slurmctld never makes it
# available). "@" (a reboot once idle), "+" (allocated, some jobs completing) and "-" (planned)
# change nothing: Slurm still starts jobs there.
DRAINING_SUFFIXES = frozenset("$^!")
_unknown_node_states: set[str] = set()  # logged once each


def node_state(state: str, reason: str) -> tuple[str, str]:
    """The portal's state of a node in Slurm's `state` (sinfo's StateLong: "idle", "mixed",
    "drained", "draining", "down*", "idle+drain", ...), and its reason as an operator reads
    it. READY only in a state known to take jobs (READY_WORDS, no DOWN or DRAINING suffix)."""
    words = set(re.split(r"[+*~#!%$@^-]", state.lower())) - {""}
    said = f"Slurm: {state}" + (f" ({reason})" if reason and reason != "none" else "")
    unknown = words - READY_WORDS - DRAINING_WORDS - DOWN_WORDS - NEUTRAL_WORDS
    if unknown and state not in _unknown_node_states:
        _unknown_node_states.add(state)
        logger.warning("Slurm node state %r is not one the connector knows; read as DOWN", state)
    if unknown or words & DOWN_WORDS or set(state) & DOWN_SUFFIXES:
        return NODE_DOWN, said
    if words & DRAINING_WORDS or set(state) & DRAINING_SUFFIXES:
        return NODE_DRAINING, said
    if not words & READY_WORDS:
        return NODE_DOWN, said
    return NODE_READY, said if state not in ("idle", "mixed", "allocated") else ""


def parse_sinfo(text: str) -> list[SlurmNode]:
    """`sinfo -N -h -O` with SINFO_FIELDS: one line per node and partition; a node of several
    partitions comes once, with all of them."""
    by_name: dict[str, dict] = {}
    for line in text.splitlines():
        fields = line.split(SEP)
        if len(fields) < len(SINFO_FIELDS):
            continue
        name, partition, state, gres, used = (f.strip() for f in fields[:5])
        # The reason is an operator's free text, and the last field: all the rest of the line.
        reason = SEP.join(fields[5:]).strip().removesuffix(SEP).strip()
        node = by_name.setdefault(
            name, {"partitions": [], "state": state, "gres": gres, "used": used, "reason": reason}
        )
        node["partitions"].append(partition.rstrip("*"))
    nodes = []
    for name, node in by_name.items():
        gpus = _gres_gpus(node["gres"])
        if not gpus:
            continue  # no GPUs: nothing for the portal
        types = {gpu_type for gpu_type, _ in gpus}
        if len(types) > 1:
            logger.warning("node %s has GPUs of several types (%s): left out (the portal's "
                           "nodes have one type)", name, node["gres"])  # fmt: skip
            continue
        state, reason = node_state(node["state"], node["reason"])
        nodes.append(
            SlurmNode(
                name=name,
                partitions=tuple(node["partitions"]),
                gpu_type=gpus[0][0],
                gpus=sum(count for _, count in gpus),
                used_gpus=sum(count for _, count in _gres_gpus(node["used"])),
                state=state,
                reason=reason,
            )
        )
    return nodes


def _exit_code(status: str) -> int | None:
    """squeue's exit_code is the batch script's wait status: 768 is exit code 3, 9 a death by
    SIGKILL (-9, as Popen says)."""
    status = status.strip()
    if ":" in status:  # Slurm 23.02 and later print "exit:signal", as sacct does
        return _status_exit_code(status)
    if not (status.isascii() and status.isdigit()):
        return None
    value = int(status)
    signal = value & 0x7F
    return -signal if signal else value >> 8


def parse_squeue(text: str) -> list[SlurmJob]:
    """`squeue -h -O` with SQUEUE_FIELDS. A job's name is whatever its user gave, the separator
    too: it is all that lies between the id and the last six fields. A line that still cannot
    be read (not one of the connector's jobs, whose names and nodes it makes) is left out."""
    jobs = []
    after_name = len(SQUEUE_FIELDS) - 2
    for line in text.splitlines():
        fields = line.split(SEP)
        if fields[-1].strip() == "":
            fields.pop()  # each field ends with the separator
        if len(fields) < len(SQUEUE_FIELDS):
            continue
        job_id, name = fields[0].strip(), SEP.join(fields[1:-after_name]).strip()
        state, reason, nodes, tres, status, partition, user = (
            f.strip() for f in fields[-after_name:]
        )
        try:
            gpus = _gres_gpus(tres.replace("gres:", "").replace("gres/", ""))
            hosts = tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else ()
        except ValueError:
            logger.warning("left out a squeue line it cannot read: %r", line[:300])
            continue
        jobs.append(
            SlurmJob(
                id=job_id,
                name=name,
                state=state.split()[0] if state else "",
                reason=reason,
                nodes=hosts,
                gpus_per_node=sum(count for _, count in gpus),
                exit_code=_exit_code(status),
                partition=partition,
                user=user,
            )
        )
    return jobs


def _status_exit_code(value: str) -> int | None:
    """sacct's and the job-completion log's ExitCode, "exit:signal": "3:0" is 3, "0:9" a death
    by SIGKILL (-9)."""
    code, _, signal = value.partition(":")
    if not code.isdigit():
        return None
    return -int(signal) if signal.isdigit() and int(signal) else int(code)


def parse_sacct(text: str) -> SlurmJob | None:
    """`sacct -n -P -X -o JobID,JobName,State,ExitCode,NodeList,Partition -j ID`: the job's
    allocation line ("CANCELLED by 0" is CANCELLED)."""
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        job_id, name, state, exit_code, nodes, partition = fields[:6]
        return SlurmJob(id=job_id, name=name, state=state.split()[0] if state else "",
                        reason="", nodes=tuple(expand_hostlist(nodes)) if nodes not in ("",
                        "None assigned") else (), gpus_per_node=0,
                        exit_code=_status_exit_code(exit_code), partition=partition)  # fmt: skip
    return None


def parse_jobcomp(text: str, job_id: str) -> SlurmJob | None:
    """The job's line in a job-completion log (JobCompType=jobcomp/filetxt): "JobId=26 ...
    Name=x JobState=NODE_FAIL ... NodeList=node2 ... ExitCode=0:0". Its ExitCode is written when
    the job is cancelled or fails, so it reads 0:0 for those: their state says enough."""
    found = None
    for line in text.splitlines():
        if not line.startswith(f"JobId={job_id} "):
            continue
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        nodes = fields.get("NodeList", "")
        found = SlurmJob(id=job_id, name=fields.get("Name", ""),
                         state=fields.get("JobState", ""), reason="",
                         nodes=tuple(expand_hostlist(nodes)) if nodes not in ("", "(null)")
                         else (), gpus_per_node=0,
                         exit_code=_status_exit_code(fields.get("ExitCode", "")),
                         partition=fields.get("Partition", ""))  # fmt: skip
    return found


def recorded_gpus(path: Path, job_id: str) -> list[int] | None:
    """The GPU indices a one-node job's batch script recorded in `path` ("JOBID 0,1\\n"); None
    when there is no whole record of that Slurm job (not written yet, being written: no closing
    newline, or an earlier job's)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    recorded_job, _, gpus = text.partition(" ")
    if recorded_job != job_id or not re.fullmatch(r"\d+(,\d+)*\n", gpus):
        return None
    return sorted(int(index) for index in gpus.split(","))


def parse_job_gpus(text: str) -> list[dict]:
    """The GPU indices Slurm gave each node of a job, from `scontrol -o -d show job ID`:
    "Nodes=node[1-2] CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:0-1)" → [{node, gpu_indices}, ...]."""
    allocations = []
    for nodes, gres in re.findall(r"\bNodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)", text):
        indices: list[int] = []
        for spec in re.findall(r"IDX:([0-9,\-]+)", gres):
            for item in spec.split(","):
                low, _, high = item.partition("-")
                indices.extend(range(int(low), int(high or low) + 1))
        for node in expand_hostlist(nodes):
            allocations.append({"node": node, "gpu_indices": sorted(indices)})
    return allocations


# --- The cluster -------------------------------------------------------------------------------


@dataclass
class SlurmCluster:
    """The Slurm cluster of the connector: its GPU nodes in `partitions`, and the jobs it
    submits there, named `{prefix}-{share}-job{J}-a{attempt}` so that an operator's squeue
    shows whose they are and the connector finds its own after a restart."""

    partitions: tuple[str, ...]
    prefix: str = "portal"
    default_gpu_type: str | None = None  # for nodes whose GRES has no type
    node_gpu_types: dict[str, str] = field(default_factory=dict)  # node name or glob → type
    sbatch_args: tuple[str, ...] = ()  # the site's own (an account, a QOS, --mem)
    env: dict[str, str] | None = None  # the commands' environment (SLURM_CONF)
    # Where the ends of jobs Slurm no longer lists are found: sacct (with accounting), else
    # the job-completion log (JobCompType=jobcomp/filetxt), as `discover` finds them.
    accounting: bool = False
    jobcomp_log: Path | None = None
    discovered: bool = False
    # Where the attempts' batch scripts are written (the connector's work directory).
    script_dir: Path = field(default_factory=lambda: Path.home() / ".gpu-agent" / "scripts")
    # The nodes as last read: a job goes to a partition that has all its nodes.
    partitions_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stale_records: FileRetention | None = None  # of `script_dir`, made at the first submit
    # Who the connector's jobs belong to: the user it runs sbatch as.
    user: str = field(default_factory=lambda: pwd.getpwuid(os.getuid()).pw_name)
    # The jobs of attempts that ended (`forget`), while squeue lists them, and those of the
    # connector's jobs that were queued when it last read them, by id.
    forgotten: set[str] = field(default_factory=set)
    in_queue: dict[str, SlurmJob] = field(default_factory=dict)

    kind = "slurm"
    manager = "Slurm"
    enforces_grace = False  # scancel after the grace period is the connector's
    holds_while_pending = False  # GresUsed counts a job's GPUs once it runs

    def start(self) -> None:
        """Nothing to watch: the connector asks (squeue, sinfo) as often as it needs."""

    def config(self) -> dict[str, str]:
        """Slurm's configuration, as `scontrol show config` prints it: key → value."""
        config = {}
        for line in self._run("scontrol", "show", "config").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                config[key.strip()] = value.strip()
        return config

    def discover(self) -> None:
        """Read from Slurm's configuration where ended jobs are recorded."""
        config = self.config()
        self.accounting = config.get("AccountingStorageType", "") not in (
            "", "accounting_storage/none",
        )  # fmt: skip
        self.discovered = True
        location = config.get("JobCompLoc", "")
        if config.get("JobCompType") == "jobcomp/filetxt" and location:
            self.jobcomp_log = Path(location)
        logger.info("ended jobs from %s",
                    "sacct" if self.accounting else self.jobcomp_log or "squeue only "
                    "(no accounting, no job-completion log: a job that ended while the "
                    "connector was away longer than MinJobAge is reported lost)")  # fmt: skip

    def _run(self, *args: str) -> str:
        if args[0] != "squeue":
            logger.debug("%s", shlex.join(args))
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS,
                env=self.env,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmUnreachable(f"{args[0]}: {error}") from error
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()[-500:]
            if _unreachable(message):
                raise SlurmUnreachable(f"{args[0]}: {message}")
            raise SlurmRefused(f"{args[0]}: {message}")
        return done.stdout

    def gpu_type_of(self, node: SlurmNode) -> str | None:
        for pattern, gpu_type in self.node_gpu_types.items():
            if fnmatchcase(node.name, pattern):
                return gpu_type
        return node.gpu_type or self.default_gpu_type

    def unknown_partitions(self) -> list[str]:
        """Those of the partitions Slurm does not have (hidden ones included): sinfo lists
        nothing for them, as for a partition without nodes."""
        known = set(self._run("sinfo", "-h", "--all", "-o", "%R").split())
        return [partition for partition in self.partitions if partition not in known]

    def nodes(self) -> list[SlurmNode]:
        """The GPU nodes of the partitions (without a GPU type known: left out, with a
        warning)."""
        text = self._run(
            "sinfo", "-N", "-h", "-p", ",".join(self.partitions),
            "-O", ",".join(f"{name}:{SEP}" for name in SINFO_FIELDS),
        )  # fmt: skip
        nodes = []
        parsed = parse_sinfo(text)
        self.partitions_of = {node.name: node.partitions for node in parsed}
        for node in parsed:
            gpu_type = self.gpu_type_of(node)
            if gpu_type is None:
                logger.warning("node %s: its GRES gpu has no type; give one with --gpu-type",
                               node.name)  # fmt: skip
                continue
            nodes.append(
                SlurmNode(
                    node.name,
                    node.partitions,
                    gpu_type,
                    node.gpus,
                    node.used_gpus,
                    node.state,
                    node.reason,
                )  # fmt: skip
            )
        return nodes

    def jobs(self) -> list[SlurmJob]:
        """Every job of the partitions Slurm still knows: running, pending, and ended within
        its MinJobAge."""
        return parse_squeue(
            self._run(
                "squeue",
                "-h",
                "--states=all",
                "-p",
                ",".join(self.partitions),
                "-O",
                ",".join(f"{name}:{SEP}" for name in SQUEUE_FIELDS),
            )  # fmt: skip
        )

    def attempt_jobs(self) -> dict[int, SlurmJob]:
        """The connector's Slurm jobs by attempt: the newest where an attempt has several (one
        ended, and its successor submitted before squeue forgot it). A job of an attempt that
        ended and that Slurm has in its queue again is cancelled (`forget`)."""
        ours: dict[int, SlurmJob] = {}
        listed: list[SlurmJob] = []
        for job in self.jobs():
            attempt_id = self.attempt_of(job)
            if attempt_id is None:
                continue
            listed.append(job)
            known = ours.get(attempt_id)
            if known is None or int(job.id) > int(known.id):
                ours[attempt_id] = job
        self.forgotten &= {job.id for job in listed}  # the rest Slurm has purged
        queued = [job for job in listed if job.queued]
        self.in_queue = {job.id: job for job in queued if job.id not in self.forgotten}
        for job in queued:
            if job.id in self.forgotten:
                self._cancel_left(job)
        return ours

    def ended_job(self, job_id: str) -> SlurmJob | None:
        """What became of a job squeue no longer lists (Slurm purged it, MinJobAge after its
        end): from sacct, else the job-completion log; None if neither knows it."""
        if not self.discovered:
            self.discover()
        if self.accounting:
            with contextlib.suppress(SlurmRefused):
                job = parse_sacct(self._run(
                    "sacct", "-n", "-P", "-X", "-j", job_id,
                    "-o", "JobID,JobName,State,ExitCode,NodeList,Partition",
                ))  # fmt: skip
                if job is not None and job.end is not None:
                    return job
        if self.jobcomp_log is not None:
            try:
                text = self.jobcomp_log.read_text(errors="replace")
            except OSError as error:
                logger.warning("cannot read the job-completion log: %s", error)
                return None
            return parse_jobcomp(text, job_id)
        return None

    def job_name(self, order: dict) -> str:
        return f"{self.prefix}-{order['share']}-job{order['job']}-a{order['attempt']}"

    def attempt_of(self, job: SlurmJob) -> int | None:
        """The portal attempt a Slurm job runs, if the connector submitted it: its name, as
        the connector's user (another user may name a job anything), and not an element of a
        job array or a heterogeneous job ("123_4", "123+0"), which the connector never makes."""
        if job.user and job.user != self.user or not (job.id.isascii() and job.id.isdigit()):
            return None
        match = re.fullmatch(rf"{re.escape(self.prefix)}-.+-job\d+-a(\d+)", job.name)
        return int(match.group(1)) if match else None

    def _partition(self, nodes: list[str]) -> str:
        """The first of the connector's partitions that has all the nodes."""
        for partition in self.partitions:
            if all(partition in self.partitions_of.get(n, ()) for n in nodes):
                return partition
        return self.partitions[0]

    def submit(self, order: dict, *, env: dict[str, str], log: Path) -> str:
        """sbatch the attempt: one Slurm job on all the nodes of its gang, each with its GPUs,
        running a batch script written for it (and removed once sbatch has it). Returns
        Slurm's job id."""
        nodes = [a["node"] for a in order["nodes"]]
        gpus = len(order["nodes"][0]["gpu_indices"])
        self.script_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_records()  # where each submit may leave one
        script = self.script_dir / f"attempt-{order['attempt']}.sh"
        gang = len(nodes) > 1
        gpus_file = None if gang else self._gpus_file(order["attempt"])
        script.write_text(batch_script(order, env, gang=gang, gpus_file=gpus_file))
        script.chmod(0o755)
        partition = self._partition(nodes)
        args = [
            "sbatch", "--parsable", f"--job-name={self.job_name(order)}",
            f"--partition={partition}", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
            "--ntasks-per-node=1", f"--gres=gpu:{gpus}", f"--output={log}", "--open-mode=append",
            f"--chdir={script.parent}", "--no-requeue", "--export=ALL",
            f"--comment=gpu-portal attempt {order['attempt']}",
        ]  # fmt: skip
        timeout = order.get("timeout_seconds")
        if timeout:
            # The connector stops it at its timeout; Slurm's limit is only the backstop.
            minutes = -(-(int(timeout) + int(order["grace_seconds"]) + 60) // 60)
            args.append(f"--time={minutes}")
        args += [*self.sbatch_args, str(script)]
        try:
            return self._run(*args).strip().split(";")[0]
        finally:
            # sbatch hands the script to slurmctld, which keeps it with the job (`scontrol
            # write batch_script` shows it): the file is not left behind for every attempt.
            script.unlink(missing_ok=True)

    def terminate(self, job_id: str, *, grace: float, started: bool) -> None:
        """SIGTERM to every process of the job, the batch script's included (without --full
        the signal reaches only the job's steps); the connector cancels it after the grace
        period. A job that has not started is cancelled at once."""
        if not started:
            self.kill(job_id)
            return
        self._run("scancel", "--signal=TERM", "--full", job_id)

    def kill(self, job_id: str) -> None:
        """Cancel the job: Slurm sends SIGTERM, then SIGKILL after its KillWait."""
        self._run("scancel", job_id)

    def forget(self, job_id: str) -> None:
        """The job's attempt has ended. Slurm purges an ended job itself, MinJobAge after its
        end; but one it still has in its queue would run again outside the portal, on GPUs the
        portal gives to others: requeued after it ran (a node failure, a prolog that failed
        with PrologFlags=ForceRequeueOnFail), held after its end (SPECIAL_EXIT, an operator's
        `scontrol requeuehold`), released by an operator. The connector owns it: it is
        cancelled now if squeue last showed it queued, and whenever squeue shows it queued
        again (`attempt_jobs`), until Slurm purges it."""
        self.forgotten.add(job_id)
        job = self.in_queue.pop(job_id, None)
        if job is not None:
            self._cancel_left(job)

    def _cancel_left(self, job: SlurmJob) -> None:
        """Cancel a job of an ended attempt that Slurm still has in its queue (`forget`): a
        plain scancel, which Slurm carries out whether the job waits or runs."""
        try:
            self.kill(job.id)
        except (SlurmRefused, SlurmUnreachable) as error:
            logger.warning("Slurm job %s (%s) of an ended attempt is still %s; cancel failed "
                           "(%s), trying again", job.id, job.name, job.state, error)  # fmt: skip
            return
        logger.warning("cancelled Slurm job %s (%s): its attempt has ended, and Slurm still had "
                       "it %s (%s); it would have run again outside the portal", job.id,
                       job.name, job.state, job.reason)  # fmt: skip

    def allocations(self, job_id: str) -> list[dict]:
        """The GPU indices Slurm gave the job on each node."""
        return parse_job_gpus(self._run("scontrol", "-o", "-d", "show", "job", job_id))

    def describe(self, job: SlurmJob, *, waited: float) -> dict | None:
        """The GPU indices of a one-node job are those its batch script recorded (Slurm's
        SLURM_JOB_GPUS, in the work directory), which costs no Slurm command; a gang's, or a
        one-node job's whose record has not come `GPUS_RECORD_WAIT_SECONDS` after it was seen
        running, are asked of slurmctld (`scontrol -d show job`)."""
        attempt = self.attempt_of(job)
        if len(job.nodes) == 1 and attempt is not None:
            record = self._gpus_file(attempt)
            gpus = recorded_gpus(record, job.id)
            if gpus is not None:
                record.unlink(missing_ok=True)  # read once: the start is reported with it
                return {"id": job.id, "allocations": [{"node": job.nodes[0], "gpu_indices": gpus}]}
            if waited < GPUS_RECORD_WAIT_SECONDS:
                return None
        try:
            allocations = self.allocations(job.id)
        except (SlurmRefused, SlurmUnreachable):
            allocations = []
        return {"id": job.id, "allocations": allocations}

    def _remove_stale_records(self) -> None:
        """GPU records that nobody read go an hour after they were written (looked at hourly)."""
        if self.stale_records is None:
            self.stale_records = FileRetention(self.script_dir, suffix=".gpus",
                                               keep_seconds=STALE_GPUS_RECORD_SECONDS)  # fmt: skip
        self.stale_records.prune_when_due()

    def _gpus_file(self, attempt: int) -> Path:
        return self.script_dir / f"attempt-{attempt}.gpus"

    def log_tail(self, job_id: str, log: Path) -> str:
        """The batch script's output file (on a file system the connector's host shares)."""
        return log_tail(log)


def _unreachable(message: str) -> bool:
    message = message.lower()
    return any(
        words in message
        for words in (
            "unable to contact slurm controller",
            "connection refused",
            "socket timed out",
            "communication connection failure",
            "slurm_load_",
            "zero bytes were transmitted",
            "munge",
        )  # fmt: skip
    )


def batch_script(
    order: dict, env: dict[str, str], *, gang: bool, gpus_file: Path | None = None
) -> str:
    """The batch script of an attempt: the portal's environment, then the job's command in its
    working directory (the one it names, which the node must have; else its checkpoint
    directory), as the job's own process (a plain command is exec'ed, so its exit
    code is the job's and SIGTERM reaches it directly), on every node of a gang through srun.
    With `gpus_file`, it first records there the GPUs Slurm gave it (`recorded_gpus`)."""
    lines = ["#!/bin/sh", f"# gpu-portal: job {order['job']}, attempt {order['number']}"]
    if gpus_file is not None:
        # By the shell's own printf (no process of its own); the connector takes the record
        # only once its closing newline is there. One that cannot be written only means the
        # connector asks slurmctld instead.
        lines.append(
            f'{{ printf \'%s %s\\n\' "$SLURM_JOB_ID" "${{SLURM_JOB_GPUS-}}" '
            f"> {shlex.quote(str(gpus_file))}; }} 2>/dev/null"
        )
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()
              if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]  # fmt: skip
    lines.append('mkdir -p "$CHECKPOINT_DIR" && cd "$CHECKPOINT_DIR" || exit 1')
    command = order["command"]
    working_dir = order.get("working_dir")
    if working_dir:
        # As a node agent would say it, in the job's log (the attempt ends with exit code 1);
        # on every node of a gang, where slurmstepd would run a task in /tmp instead.
        # The node's name is the shell's to fill in: echo puts it after the message.
        message = shlex.quote(
            "gpu-portal: " + WORKING_DIR_MISSING.format(path=working_dir, node="").rstrip()
        )
        enter = (f'cd {shlex.quote(working_dir)} 2>/dev/null || '
                 f'{{ echo {message} "$SLURMD_NODENAME" >&2; exit 1; }}')  # fmt: skip
        lines.append(enter)
        command = f"{enter}\n{command}" if gang else command
    if gang:
        lines.append(
            "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --export=ALL /bin/sh -c "
            + shlex.quote(command)
        )
    else:
        lines.append(shell_line(command))
    return "\n".join(lines) + "\n"


def slurm_environment(slurm_conf: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env
