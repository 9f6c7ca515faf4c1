"""The written-out SQL of the agent requests: every poll and report reads its node and its
orders, and every report locks its jobs and attempts. Composed with the ORM, these queries
cost the web process much more CPU per job than written out (bench/soak.py). The SQL is
written once per process and prepared once per connection (`portal.db.sql.prepared_cursor`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, models

from portal.db.sql import select_rows
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.transitions import Transitions
from shares.models import QuotaShare


def _columns(*names: str) -> tuple[models.Field, ...]:
    """The fields named "model.field" (model: node, job, attempt, gpu, share), in order."""
    models_by_alias = {"node": Node, "job": Job, "attempt": JobAttempt, "gpu": GpuAssignment,
                       "share": QuotaShare}  # fmt: skip
    fields = []
    for name in names:
        alias, _, field = name.partition(".")
        fields.append(models_by_alias[alias]._meta.get_field(field))
    return tuple(fields)


def _in_model_order(fields: tuple[models.Field, ...]) -> tuple[models.Field, ...]:
    """`fields` of one model in the model's order, as Model.from_db() takes their values."""
    return tuple(f for f in fields[0].model._meta.concrete_fields if f in fields)


def _sql(template: str, fields: Sequence[models.Field]) -> str:
    """`template` with {columns} (`fields` as alias.column) and {table} placeholders
    ({job}, {attempt}, ... : the models' quoted table names) filled in."""
    quote = connection.ops.quote_name
    alias = {Node: "node", Job: "job", JobAttempt: "attempt", GpuAssignment: "gpu",
             QuotaShare: "share"}  # fmt: skip
    columns = ", ".join(f"{alias[f.model]}.{quote(f.column)}" for f in fields)
    tables = {name: quote(model._meta.db_table) for model, name in alias.items()}
    return template.format(columns=columns, **tables)


# What an agent request needs of its node (not its gpu_details nor labels).
NODE_FIELDS = ("id", "name", "gpu_type", "gpus", "state", "last_heartbeat")


@cache
def node_for_token_query() -> tuple[str, tuple[models.Field, ...]]:
    fields = _in_model_order(_columns(*(f"node.{name}" for name in NODE_FIELDS)))
    template = (
        "SELECT {columns} FROM {node} node WHERE node.token_hash = %s ORDER BY node.id LIMIT 1"
    )
    return _sql(template, fields), fields


@cache
def heartbeat_sql() -> str:
    return _sql("UPDATE {node} SET last_heartbeat = %s WHERE id = %s", ())


@cache
def orders_sql() -> str:
    """Every GPU a node (the first parameter) holds, not released (the second), with what its
    attempt's order needs, by attempt."""
    fields = _columns(
        "gpu.gpu_index", "attempt.id", "attempt.number", "attempt.started_at",
        "attempt.stop_requested_at", "job.id", "job.command", "job.env", "job.working_dir",
        "job.timeout_seconds", "share.grace_seconds", "job.nodes",
    )  # fmt: skip
    template = (
        "SELECT {columns} FROM {gpu} gpu "
        "JOIN {attempt} attempt ON attempt.id = gpu.attempt_id "
        "JOIN {job} job ON job.id = attempt.job_id "
        "JOIN {share} share ON share.id = job.share_id "
        "WHERE gpu.node_id = %s AND gpu.released = %s AND attempt.ended_at IS NULL "
        "ORDER BY gpu.attempt_id, gpu.gpu_index"
    )
    return _sql(template, fields)


@cache
def connector_orders_sql() -> str:
    """Every GPU held on a connector's nodes (its id, the first parameter), not released (the
    second), with its node's name and what its attempt's order needs, by attempt and node."""
    fields = _columns(
        "node.name", "gpu.gpu_index", "attempt.id", "attempt.number", "attempt.started_at",
        "attempt.stop_requested_at", "job.id", "job.command", "job.env", "job.image",
        "job.working_dir",
        "job.timeout_seconds", "share.grace_seconds", "share.name", "attempt.cluster_job",
    )  # fmt: skip
    template = (
        "SELECT {columns} FROM {gpu} gpu "
        "JOIN {node} node ON node.id = gpu.node_id "
        "JOIN {attempt} attempt ON attempt.id = gpu.attempt_id "
        "JOIN {job} job ON job.id = attempt.job_id "
        "JOIN {share} share ON share.id = job.share_id "
        "WHERE node.connector_id = %s AND gpu.released = %s AND attempt.ended_at IS NULL "
        "ORDER BY gpu.attempt_id, node.name, gpu.gpu_index"
    )
    return _sql(template, fields)


# What the reports read and write of an attempt, and of its job.
ATTEMPT_FIELDS = (
    "job_id", "number", "allocations", "started_at", "stop_requested_at", "ended_at", "outcome",
    "exit_code", "preempted_for_id",
)  # fmt: skip
JOB_FIELDS = (
    *Transitions.FIELDS, "max_preemptions", "retry_attempts", "cancel_requested", "timeout_seconds",
)  # fmt: skip


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _job_lock_query(condition: str) -> tuple[str, tuple[models.Field, ...]]:
    """The jobs that meet `condition` (SQL about `job`), locked in id order, as Jobs with
    JOB_FIELDS loaded."""
    fields = _in_model_order(_columns("job.id", *(f"job.{name}" for name in JOB_FIELDS)))
    lock = " FOR UPDATE OF job" if connection.features.has_select_for_update_of else ""
    template = f"SELECT {{columns}} FROM {{job}} job WHERE {condition} ORDER BY job.id{lock}"
    return _sql(template, fields), fields


def jobs_locked(query: tuple[str, tuple[models.Field, ...]], params: Sequence) -> list[Job]:
    sql, columns = query
    names = [field.attname for field in columns]
    return [Job.from_db(DEFAULT_DB_ALIAS, names, row) for row in select_rows(sql, params, columns)]


@cache
def jobs_lock_query(count: int) -> tuple[str, tuple[models.Field, ...]]:
    """The jobs of `count` attempts."""
    return _job_lock_query(
        f"job.id IN (SELECT job_id FROM {{attempt}} WHERE id IN ({_placeholders(count)}))"
    )


@cache
def holders_query(count: int) -> tuple[str, tuple[models.Field, ...]]:
    """The nodes where `count` attempts (given twice) hold GPUs, with their ATTEMPT_FIELDS: a
    row per node and attempt, not per GPU (a gang's attempt holds GPUs on many nodes, and its
    `allocations` lists them all: read per GPU, every node's report of a 32-node gang decoded
    that list 256 times)."""
    fields = _columns("gpu.node", "attempt.id", *(f"attempt.{name}" for name in ATTEMPT_FIELDS))
    template = (
        "SELECT {columns} FROM {gpu} gpu JOIN {attempt} attempt ON attempt.id = gpu.attempt_id "
        f"WHERE gpu.released = %s AND gpu.attempt_id IN ({_placeholders(count)}) "
        # The same ids again, on the attempts' primary key: without it PostgreSQL may hash the
        # GPUs' rows against a scan of every attempt ever run (seen without table statistics,
        # a scan per report).
        f"AND attempt.id IN ({_placeholders(count)}) "
        # The attempt's columns depend on its primary key, which both databases accept.
        "GROUP BY gpu.node_id, attempt.id"
    )
    return _sql(template, fields), fields


@cache
def start_query(count: int, *, started: bool = False) -> tuple[str, tuple[models.Field, ...]]:
    """Record the start of `count` attempts (after the start time, the node and False): only
    those whose stop was not ordered, that have not ended and that hold GPUs on the node
    (`started`: and that have started already, on another node of their gang or before an
    answer that was lost). The condition is the UPDATE's own, so a stop order written at the
    same moment either comes first (no start) or waits for this one (a stop of a started
    attempt). Returns the started attempts: these `fields`, the columns RETURNING names."""
    fields = _columns("attempt.id", "attempt.job", "attempt.allocations")
    again = "AND started_at IS NOT NULL " if started else ""
    template = (
        "UPDATE {attempt} SET started_at = COALESCE(started_at, %s) "
        f"WHERE stop_requested_at IS NULL AND ended_at IS NULL {again}"
        "AND id IN (SELECT attempt_id FROM {gpu} WHERE node_id = %s AND released = %s "
        f"AND attempt_id IN ({_placeholders(count)})) "
        "RETURNING id, job_id, allocations"
    )
    return _sql(template, ()), fields


@cache
def release_sql(count: int, *, nodes: int = 1) -> str:
    """Release the GPUs `count` attempts hold on `nodes` nodes (after True, the node ids and
    False, the attempt ids)."""
    return _sql(
        f"UPDATE {{gpu}} SET released = %s WHERE node_id IN ({_placeholders(nodes)}) "
        f"AND released = %s AND attempt_id IN ({_placeholders(count)})",
        (),
    )
