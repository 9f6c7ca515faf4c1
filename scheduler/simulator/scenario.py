"""Read a scenario (YAML, plus an optional CSV trace) and check it strictly.

Everything the scenario says is checked here, before the clock starts, so that a typo fails
fast with a message naming the entry ("shares[1] (vision): ...") instead of a silent default.
Rules that are about one job and that the portal would enforce at submission (a job larger than
any node set, a GPU type its share has no limit for) are not errors: the job gets a `reject` event.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import Any

import yaml

from scheduler.engine.snapshot import (
    CHURN_PREEMPTIONS,
    CHURN_WINDOW_SECONDS,
    DISABLED,
    ENABLED,
    FAIR,
    FIFO,
    LEND_AND_BORROW,
    STRATEGIES,
    UNLIMITED,
    NodeView,
    ShareView,
)
from scheduler.limits import MAX_GPUS_PER_NODE

MAX_GPU_TYPES = 5
MAX_PRIORITY = 9999
# Times and durations in seconds are at most this (about 31,700 years): far beyond any trace, and
# small enough that GPU-seconds summed over a run stay finite numbers in the result JSON.
MAX_SECONDS = 10**12

TOP_LEVEL_KEYS = {"borrow_order", "churn", "nodes", "shares", "jobs", "trace", "changes"}
CHURN_KEYS = {"preemptions", "window_seconds"}
NODE_KEYS = {"name", "gpu_type", "gpus", "count"}
SHARE_KEYS = {
    "name",
    "team",
    "capacity_limits",
    "strategy",
    "borrow_limit",
    "lend_limit",
    "in_share_preemption",
    "grace_seconds",
    "state",
    "weight",
    "strict_fifo",
    "min_runtime_seconds",
}
REQUIRED_SHARE_KEYS = ("name", "capacity_limits", "strategy")
REQUIRED_JOB_KEYS = ("id", "share", "gpu_type", "gpus", "submit", "duration")
TRACE_COLUMNS = ("id", "share", "gpu_type", "gpus", "submit", "duration", "priority")
OPTIONAL_TRACE_COLUMNS = ("nodes", "max_preemptions", "checkpoint_interval", "preemptible")
JOB_KEYS = set(TRACE_COLUMNS + OPTIONAL_TRACE_COLUMNS)
CHANGE_KEYS = {"at", "share", "set"}

SLUG = re.compile(r"^[a-z0-9]([a-z0-9_-]*[a-z0-9])?$")


class ScenarioError(ValueError):
    """The scenario breaks a rule; the message names the entry and the rule."""


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"line {line}: the key {key} is given twice")
        self.key = key
        self.line = line


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML
    would keep the last value silently, and a scenario is simulated as written. A key a merge
    (`<<: *defaults`) brings in may still be set again, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                given_twice = key in seen
            except TypeError:
                continue  # an unhashable key: the base loader says so
            if given_twice:
                raise _DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class JobSpec:
    """A job of the scenario: `duration` seconds of work, submitted at `submit`."""

    id: str
    share: str
    gpu_type: str
    gpus: int
    submit: float
    duration: float
    priority: int = 0
    nodes: int = 1
    max_preemptions: int | None = None
    checkpoint_interval: float | None = None
    preemptible: bool = True


@dataclass(frozen=True)
class ShareChange:
    """Share settings replaced at time `at` (a whole new `ShareView`, already checked)."""

    at: float
    share: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[NodeView, ...]
    shares: tuple[ShareView, ...]
    jobs: tuple[JobSpec, ...]
    changes: tuple[ShareChange, ...] = ()
    borrow_order: str = FIFO
    source: str = field(default="<scenario>", compare=False)
    # The churn breaker (docs/semantics.md): preemptions within the window; 0: none.
    churn_preemptions: int = CHURN_PREEMPTIONS
    churn_window_seconds: float = CHURN_WINDOW_SECONDS


def load_scenario(path: str | Path) -> Scenario:
    """Read and check the scenario at `path` (its `trace`, if any, is relative to it)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from exc
    except ValueError as exc:  # not UTF-8, or a path with a NUL byte
        raise ScenarioError(f"scenario {path}: not a UTF-8 YAML file ({exc})") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # safe: a SafeLoader
    except _DuplicateKeyError as exc:
        raise ScenarioError(f"{path} {exc} (each key may be given once)") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    return parse_scenario(data, base_dir=path.parent, source=str(path))


def parse_scenario(
    data: Any, *, base_dir: Path | None = None, source: str = "<scenario>"
) -> Scenario:
    """Check a scenario already read from YAML (a mapping) and build it."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: the scenario must be a mapping of {sorted(TOP_LEVEL_KEYS)}")
    _no_unknown_keys(data, TOP_LEVEL_KEYS, "scenario")
    borrow_order = data.get("borrow_order", FIFO)
    if borrow_order not in (FIFO, FAIR):
        raise ScenarioError(f"borrow_order: must be {FIFO!r} or {FAIR!r}, not {borrow_order!r}")

    nodes = _parse_nodes(data.get("nodes"))
    shares = _parse_shares(data.get("shares"))
    share_by_name = {s.name: s for s in shares}

    jobs: list[JobSpec] = []
    raw_jobs = data.get("jobs") or []
    if not isinstance(raw_jobs, list):
        raise ScenarioError("jobs: must be a list")
    for index, raw in enumerate(raw_jobs):
        jobs.append(_parse_job(raw, f"jobs[{index}]", share_by_name))
    if "trace" in data:
        trace = data["trace"]
        if not isinstance(trace, str) or not trace:
            raise ScenarioError("trace: must be a path to a CSV file")
        trace_path = Path(trace)
        if not trace_path.is_absolute():
            trace_path = (base_dir or Path.cwd()) / trace_path
        jobs.extend(read_trace(trace_path, share_by_name))
    if not jobs:
        raise ScenarioError("scenario: give `jobs`, a `trace`, or both")
    seen: set[str] = set()
    for job in jobs:
        if job.id in seen:
            raise ScenarioError(f"job {job.id}: the id is used twice")
        seen.add(job.id)

    changes = _parse_changes(data.get("changes"), share_by_name)
    churn_preemptions, churn_window = _parse_churn(data.get("churn"))
    return Scenario(
        nodes=nodes,
        shares=shares,
        jobs=tuple(jobs),
        changes=changes,
        borrow_order=borrow_order,
        source=source,
        churn_preemptions=churn_preemptions,
        churn_window_seconds=churn_window,
    )


def _parse_churn(raw: Any) -> tuple[int, float]:
    """The scenario's `churn: {preemptions: K, window_seconds: W}` (either may be left out)."""
    if raw is None:
        return CHURN_PREEMPTIONS, CHURN_WINDOW_SECONDS
    if not isinstance(raw, dict):
        raise ScenarioError(f"churn: must be a mapping of {sorted(CHURN_KEYS)}")
    _no_unknown_keys(raw, CHURN_KEYS, "churn")
    preemptions = _int(raw.get("preemptions", CHURN_PREEMPTIONS), "churn", "preemptions", minimum=0)
    window = raw.get("window_seconds", CHURN_WINDOW_SECONDS)
    if not _finite(window) or not 0 < window <= MAX_SECONDS:
        raise ScenarioError(
            f"churn: window_seconds must be a number of seconds > 0 and <= {MAX_SECONDS}"
        )
    return preemptions, float(window)


def read_trace(path: Path, share_by_name: Mapping[str, ShareView]) -> list[JobSpec]:
    """Jobs of a CSV trace; each bad row is reported with its line number and job id."""
    try:
        # utf-8-sig: a byte order mark (Excel's "CSV UTF-8") is not part of the first column.
        handle = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise ScenarioError(f"trace {path}: cannot read it: {exc.strerror}") from exc
    except ValueError as exc:  # a path with a NUL byte
        raise ScenarioError(f"trace {path!r}: not a usable path ({exc})") from exc
    try:
        with handle:
            return _read_trace_rows(handle, path, share_by_name)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ScenarioError(f"trace {path.name}: not a UTF-8 CSV file ({exc})") from exc


def _read_trace_rows(handle, path: Path, share_by_name: Mapping[str, ShareView]) -> list[JobSpec]:
    reader = csv.reader(handle)
    columns = next(reader, [])
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ScenarioError(
            f"trace {path.name}: column{'s' if len(repeated) > 1 else ''} "
            f"{', '.join(repeated)} given twice in the header (each column may be given once)"
        )
    missing = [c for c in TRACE_COLUMNS if c not in columns]
    if missing:
        raise ScenarioError(f"trace {path.name}: missing columns {', '.join(missing)}")
    unknown = [c for c in columns if c not in TRACE_COLUMNS + OPTIONAL_TRACE_COLUMNS]
    if unknown:
        raise ScenarioError(f"trace {path.name}: unknown columns {', '.join(unknown)}")
    well_formed = _WellFormedRows(columns, share_by_name)
    jobs = []
    for row in reader:
        if not row:
            continue  # a blank line
        job = well_formed.job(row) if len(row) == len(columns) else None
        if job is None:
            # An empty optional cell means "not set", like a key left out in YAML.
            raw = {k: v for k, v in _cells(columns, row).items() if v not in ("", None)}
            where = f"trace {path.name} line {reader.line_num}"
            job = _parse_job(raw, where, share_by_name, from_text=True)
        jobs.append(job)
    return jobs


def _cells(columns: list[str], row: list[str]) -> dict[str | None, Any]:
    """A row by column, as csv.DictReader gives it: cells beyond the header under None, missing
    cells None."""
    cells: dict[str | None, Any] = dict(zip(columns, row, strict=False))
    if len(row) > len(columns):
        cells[None] = row[len(columns) :]
    for column in columns[len(row) :]:
        cells[column] = None
    return cells


class _WellFormedRows:
    """Reads a trace row in one go when every cell is well-formed, as most rows of a long trace
    are: the same job `_parse_job` gives, or None to let `_parse_job` read the row and say what
    is wrong with it."""

    def __init__(self, columns: list[str], share_by_name: Mapping[str, ShareView]) -> None:
        at = {column: i for i, column in enumerate(columns)}  # each column is given once
        self._shares = share_by_name
        self._required = itemgetter(*(at[c] for c in TRACE_COLUMNS))
        self._nodes = at.get("nodes")
        self._max_preemptions = at.get("max_preemptions")
        self._checkpoint = at.get("checkpoint_interval")
        self._preemptible = at.get("preemptible")

    def job(self, row: list[str]) -> JobSpec | None:
        job_id, share, gpu_type, gpus, submit, duration, priority = self._required(row)
        if not job_id or not gpu_type or share not in self._shares:
            return None
        gpus = _whole(gpus, 1)
        submit = _seconds(submit)
        duration = _seconds(duration)
        priority = _whole(priority, 0) if priority else 0
        nodes = _whole(row[self._nodes], 1) if self._nodes is not None and row[self._nodes] else 1
        max_preemptions = checkpoint = None
        if self._max_preemptions is not None and row[self._max_preemptions]:
            max_preemptions = _whole(row[self._max_preemptions], 0)
            if max_preemptions is None:
                return None
        if self._checkpoint is not None and row[self._checkpoint]:
            checkpoint = _seconds(row[self._checkpoint])
            if checkpoint is None or checkpoint <= 0:
                return None
        preemptible = True
        if self._preemptible is not None and row[self._preemptible]:
            preemptible = {"true": True, "false": False}.get(row[self._preemptible].lower())
            if preemptible is None:
                return None
        if (
            gpus is None
            or submit is None
            or submit < 0
            or duration is None
            or duration <= 0
            or priority is None
            or priority > MAX_PRIORITY
            or nodes is None
        ):
            return None
        return JobSpec(
            id=job_id,
            share=share,
            gpu_type=gpu_type,
            gpus=gpus,
            submit=submit,
            duration=duration,
            priority=priority,
            nodes=nodes,
            max_preemptions=max_preemptions,
            checkpoint_interval=checkpoint,
            preemptible=preemptible,
        )


def _seconds(text: str) -> float | None:
    """A number of seconds of a CSV cell, at most MAX_SECONDS, whole ones as int (as
    `_seconds_value` of `_number_from_text`); None if not."""
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number) or number > MAX_SECONDS:
        return None
    return int(number) if number.is_integer() else number


def _whole(text: str, minimum: int) -> int | None:
    """A whole number >= `minimum` of a CSV cell (as `_int` of `_number_from_text`); None if
    not."""
    try:
        number = float(text)
    except ValueError:
        return None
    if not number.is_integer() or number < minimum:
        return None
    return int(number)


def _parse_nodes(raw: Any) -> tuple[NodeView, ...]:
    if not isinstance(raw, list) or not raw:
        raise ScenarioError("nodes: must be a non-empty list")
    nodes: list[NodeView] = []
    for index, entry in enumerate(raw):
        where = _checked_entry(
            entry, f"nodes[{index}]", NODE_KEYS, ("name", "gpu_type", "gpus"), label="name"
        )
        name = _text(entry["name"], where, "name")
        gpu_type = _text(entry["gpu_type"], where, "gpu_type")
        gpus = _int(entry["gpus"], where, "gpus", minimum=1)
        if gpus > MAX_GPUS_PER_NODE:
            raise ScenarioError(
                f"{where}: gpus must be at most {MAX_GPUS_PER_NODE} (the portal's most GPUs on "
                f"one node), not {gpus}"
            )
        if "count" in entry:
            count = _int(entry["count"], where, "count", minimum=1)
            names = [f"{name}-{i}" for i in range(count)]
        else:
            names = [name]
        nodes.extend(NodeView(name=n, gpu_type=gpu_type, gpus=gpus) for n in names)
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise ScenarioError(f"nodes: the node name {node.name} is used twice")
        seen.add(node.name)
    return tuple(nodes)


def _parse_shares(raw: Any) -> tuple[ShareView, ...]:
    if not isinstance(raw, list) or not raw:
        raise ScenarioError("shares: must be a non-empty list")
    shares: list[ShareView] = []
    for index, entry in enumerate(raw):
        where = _checked_entry(
            entry, f"shares[{index}]", SHARE_KEYS, REQUIRED_SHARE_KEYS, label="name"
        )
        name = _text(entry["name"], where, "name")
        if not SLUG.match(name):
            raise ScenarioError(f"{where}: name must be a slug (lower-case letters, digits, - _)")
        fields = {k: v for k, v in entry.items() if k not in ("name", "team")}
        shares.append(_build_share(name, fields, where))
    seen: set[str] = set()
    for share in shares:
        if share.name in seen:
            raise ScenarioError(f"shares: the share name {share.name} is used twice")
        seen.add(share.name)
    return tuple(shares)


def _build_share(name: str, fields: Mapping[str, Any], where: str) -> ShareView:
    """A `ShareView` from scenario fields, checked against the rules of DESIGN §2."""
    limits_raw = fields["capacity_limits"]
    if not isinstance(limits_raw, dict):
        raise ScenarioError(f"{where}: capacity_limits must be a map of GPU type to GPUs")
    if not 1 <= len(limits_raw) <= MAX_GPU_TYPES:
        raise ScenarioError(
            f"{where}: capacity_limits must name 1 to {MAX_GPU_TYPES} GPU types, "
            f"not {len(limits_raw)}"
        )
    limits = {
        _text(t, where, "capacity_limits type"): _int(n, where, f"capacity_limits[{t}]", minimum=1)
        for t, n in limits_raw.items()
    }
    strategy = fields["strategy"]
    if strategy not in STRATEGIES:
        raise ScenarioError(f"{where}: strategy must be one of {', '.join(STRATEGIES)}")
    borrow_limit = _int(fields.get("borrow_limit", UNLIMITED), where, "borrow_limit", minimum=-1)
    if borrow_limit != UNLIMITED and strategy != LEND_AND_BORROW:
        raise ScenarioError(
            f"{where}: borrow_limit {borrow_limit} is only allowed with LEND_AND_BORROW "
            f"(a {strategy} share never borrows; use -1)"
        )
    lend_limit = _parse_lend_limit(fields.get("lend_limit"), limits, where)
    grace = fields.get("grace_seconds", 120)
    if not _finite(grace) or not 0 <= grace <= MAX_SECONDS:
        raise ScenarioError(
            f"{where}: grace_seconds must be a number of seconds >= 0 and <= {MAX_SECONDS}"
        )
    state = fields.get("state", ENABLED)
    if state not in (ENABLED, DISABLED):
        raise ScenarioError(f"{where}: state must be {ENABLED} or {DISABLED}")
    weight = fields.get("weight", 1.0)
    if not _finite(weight) or weight <= 0:
        raise ScenarioError(f"{where}: weight must be a number > 0")
    min_runtime = fields.get("min_runtime_seconds", 0)
    if not _finite(min_runtime) or not 0 <= min_runtime <= MAX_SECONDS:
        raise ScenarioError(
            f"{where}: min_runtime_seconds must be a number of seconds >= 0 and <= {MAX_SECONDS}"
        )
    return ShareView(
        name=name,
        capacity_limits=limits,
        strategy=strategy,
        borrow_limit=borrow_limit,
        lend_limit=lend_limit,
        in_share_preemption=_bool(
            fields.get("in_share_preemption", False), where, "in_share_preemption"
        ),
        grace_seconds=grace,
        state=state,
        weight=float(weight),
        strict_fifo=_bool(fields.get("strict_fifo", False), where, "strict_fifo"),
        min_runtime_seconds=min_runtime,
    )


def _parse_lend_limit(raw: Any, limits: Mapping[str, int], where: str) -> dict[str, int] | None:
    if raw is None:
        return None
    if isinstance(raw, dict):
        lend = {}
        for gpu_type, gpus in raw.items():
            if gpu_type not in limits:
                raise ScenarioError(
                    f"{where}: lend_limit names {gpu_type}, which capacity_limits does not"
                )
            lend[gpu_type] = _int(gpus, where, f"lend_limit[{gpu_type}]", minimum=0)
    else:
        # A plain number is the same for every GPU type (DESIGN §2).
        gpus = _int(raw, where, "lend_limit", minimum=0)
        lend = dict.fromkeys(limits, gpus)
    for gpu_type, gpus in lend.items():
        if gpus > limits[gpu_type]:
            raise ScenarioError(
                f"{where}: lend_limit {gpus} {gpu_type} is above the limit {limits[gpu_type]}"
            )
    return lend


def _parse_job(
    raw: Any, where: str, share_by_name: Mapping[str, ShareView], *, from_text: bool = False
) -> JobSpec:
    if from_text and isinstance(raw, dict) and None in raw:
        # csv.DictReader's key for the cells of a row beyond the header's columns.
        extra = len(raw[None])
        raise ScenarioError(
            f"{where}: the row has {extra} cell{'s' if extra > 1 else ''} more than the header "
            "has columns (a row may have at most one cell per column)"
        )
    where = _checked_entry(raw, where, JOB_KEYS, REQUIRED_JOB_KEYS, label="id")
    share = str(raw["share"])
    if share not in share_by_name:
        raise ScenarioError(f"{where}: unknown share {share!r}")
    number = _number_from_text if from_text else _number
    priority = _int(number(raw.get("priority", 0), where, "priority"), where, "priority", minimum=0)
    if priority > MAX_PRIORITY:
        raise ScenarioError(f"{where}: priority must be 0 to {MAX_PRIORITY}")
    max_preemptions = raw.get("max_preemptions")
    if max_preemptions is not None:
        max_preemptions = _int(
            number(max_preemptions, where, "max_preemptions"), where, "max_preemptions", minimum=0
        )
    checkpoint = raw.get("checkpoint_interval")
    if checkpoint is not None:
        checkpoint = _seconds_value(
            number(checkpoint, where, "checkpoint_interval"), where, "checkpoint_interval"
        )
        if checkpoint <= 0:
            raise ScenarioError(f"{where}: checkpoint_interval must be > 0 seconds")
    submit = _seconds_value(number(raw["submit"], where, "submit"), where, "submit")
    if submit < 0:
        raise ScenarioError(f"{where}: submit must be >= 0")
    duration = _seconds_value(number(raw["duration"], where, "duration"), where, "duration")
    if duration <= 0:
        raise ScenarioError(f"{where}: duration must be > 0 seconds")
    return JobSpec(
        id=_text(raw["id"], where, "id"),
        share=share,
        gpu_type=_text(raw["gpu_type"], where, "gpu_type"),
        gpus=_int(number(raw["gpus"], where, "gpus"), where, "gpus", minimum=1),
        submit=submit,
        duration=duration,
        priority=priority,
        nodes=_int(number(raw.get("nodes", 1), where, "nodes"), where, "nodes", minimum=1),
        max_preemptions=max_preemptions,
        checkpoint_interval=checkpoint,
        preemptible=_preemptible(raw.get("preemptible", True), where, from_text),
    )


def _preemptible(value: Any, where: str, from_text: bool) -> bool:
    """A job's `preemptible`: true or false (in a CSV trace, the words)."""
    if from_text and isinstance(value, str):
        words = {"true": True, "false": False}
        if value.lower() not in words:
            raise ScenarioError(f"{where}: preemptible must be true or false")
        return words[value.lower()]
    return _bool(value, where, "preemptible")


def _parse_changes(raw: Any, share_by_name: Mapping[str, ShareView]) -> tuple[ShareChange, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ScenarioError("changes: must be a list")
    entries = []
    for index, entry in enumerate(raw):
        where = _checked_entry(entry, f"changes[{index}]", CHANGE_KEYS, ("at", "share", "set"))
        at = _seconds_value(_number(entry["at"], where, "at"), where, "at")
        if at < 0:
            raise ScenarioError(f"{where}: at must be >= 0")
        share = str(entry["share"])
        if share not in share_by_name:
            raise ScenarioError(f"{where}: unknown share {share!r}")
        settings = entry["set"]
        if not isinstance(settings, dict) or not settings:
            raise ScenarioError(f"{where}: set must be a non-empty map of share fields")
        _no_unknown_keys(settings, SHARE_KEYS - {"name"}, f"{where} set")
        entries.append((at, index, share, settings, where))

    # Apply the changes in time order to check each resulting share (e.g. a strategy switch to
    # RESERVE while borrow_limit is still 50 is an error at that change, not at run time).
    current = {name: _share_fields(share) for name, share in share_by_name.items()}
    changes = []
    for at, _index, share, settings, where in sorted(entries, key=lambda e: (e[0], e[1])):
        fields = {**current[share], **{k: v for k, v in settings.items() if k != "team"}}
        new_limits = settings.get("capacity_limits")
        if isinstance(new_limits, dict) and "lend_limit" not in settings:
            # A new set of GPU types drops lend limits for the types it no longer names.
            lend = fields.get("lend_limit")
            if isinstance(lend, dict):
                fields["lend_limit"] = {t: n for t, n in lend.items() if t in new_limits} or None
        built = _build_share(share, fields, f"{where} ({share})")
        current[share] = _share_fields(built)
        changes.append(ShareChange(at=at, share=share, fields=current[share]))
    return tuple(changes)


def _share_fields(share: ShareView) -> dict[str, Any]:
    return {
        "capacity_limits": dict(share.capacity_limits),
        "strategy": share.strategy,
        "borrow_limit": share.borrow_limit,
        "lend_limit": dict(share.lend_limit) if share.lend_limit is not None else None,
        "in_share_preemption": share.in_share_preemption,
        "grace_seconds": share.grace_seconds,
        "state": share.state,
        "weight": share.weight,
        "strict_fifo": share.strict_fifo,
        "min_runtime_seconds": share.min_runtime_seconds,
    }


def share_with(share: ShareView, fields: Mapping[str, Any]) -> ShareView:
    """`share` with the (already checked) settings of a change."""
    return replace(share, **fields)


def _checked_entry(
    entry: Any, where: str, allowed: set[str], required: tuple[str, ...], label: str | None = None
) -> str:
    """Check one entry of a list: a mapping with only `allowed` keys and every `required` one.
    Returns how messages name it: `where`, with the entry's `label` key when it has one."""
    if not isinstance(entry, dict):
        raise ScenarioError(f"{where}: must be a mapping")
    if label is not None and label in entry:
        where = f"{where} ({entry[label]})"
    _no_unknown_keys(entry, allowed, where)
    for key in required:
        if key not in entry:
            raise ScenarioError(f"{where}: `{key}` is required")
    return where


def _no_unknown_keys(entry: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )


def _text(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise ScenarioError(f"{where}: {key} must be a non-empty name")
    return str(value)


def _int(value: Any, where: str, key: str, *, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: {key} must be a whole number, not {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: {key} must be >= {minimum}, not {value}")
    return value


def _bool(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}: {key} must be true or false")
    return value


def _finite(value: Any) -> bool:
    """A number a clock can use: not a bool, not NaN, not infinite."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _number(value: Any, where: str, key: str) -> float:
    if not _finite(value):
        raise ScenarioError(f"{where}: {key} must be a number, not {value!r}")
    return value


def _seconds_value(seconds: float, where: str, key: str) -> float:
    """A time or duration no larger than MAX_SECONDS (what the result JSON can hold)."""
    if seconds > MAX_SECONDS:
        raise ScenarioError(f"{where}: {key} must be at most {MAX_SECONDS} seconds, not {seconds}")
    return seconds


def _number_from_text(value: Any, where: str, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value, where, key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"{where}: {key} must be a number, not {value!r}") from None
    _number(number, where, key)
    return int(number) if number.is_integer() else number
