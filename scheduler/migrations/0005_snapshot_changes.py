"""The cycle's change feed: the database itself records every job whose snapshot rows may have
changed, so the worker can keep its snapshot between cycles (scheduler/cycle/snapshot.py).

Triggers, not the services, write the feed: every write path (services, the agents' written-out
SQL, the admin, a shell, a test's ORM update) goes through them, in the writer's transaction.

- scheduler_snapshotchange: one row per change of a job or of one of its attempts (insert,
  delete, or an update of a column the snapshot reads): the job's id. The cycle consumes the
  rows (DELETE ... RETURNING) under its lock; a row committed after that stays for the next
  cycle, so no change is missed whatever order transactions commit in.
- scheduler_snapshotstate: one row, the token of the last cycle that consumed the feed. A worker
  whose cached snapshot was brought up to date by another token (another worker's cycle, a
  rolled-back cycle, a TRUNCATE, which row triggers do not see and which clears the token)
  reloads everything.

On PostgreSQL a job's `reason` written by the cycle itself, which updates its own copy, is not
recorded (the setting portal.snapshot_quiet, local to the cycle's transaction): a placing cycle
rewrites tens of thousands of them. Every other change of a reason is.
"""

from django.db import migrations

# The columns of a job and of an attempt the snapshot reads (scheduler/cycle/snapshot.py).
JOB_COLUMNS = (
    "state", "share_id", "gpu_type", "gpus", "nodes", "priority", "submitted_at", "attempt_count",
)  # fmt: skip
ATTEMPT_COLUMNS = (
    "job_id", "number", "allocations", "borrowed_gpus", "scheduled_at", "started_at",
    "stop_requested_at", "ended_at", "outcome", "preempted_for_id",
)  # fmt: skip


def _row(prefix: str, columns) -> str:
    return "(" + ", ".join(f"{prefix}.{column}" for column in columns) + ")"


POSTGRESQL = [
    "CREATE TABLE scheduler_snapshotchange (id bigserial PRIMARY KEY, job_id bigint NOT NULL)",
    "CREATE TABLE scheduler_snapshotstate (id integer PRIMARY KEY, token varchar(64) NOT NULL)",
    """CREATE FUNCTION scheduler_job_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.id);
        ELSE
            INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.id);
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION scheduler_attempt_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.job_id);
        END IF;
        IF TG_OP <> 'DELETE' THEN
            INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.job_id);
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION scheduler_snapshot_forget() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM scheduler_snapshotstate;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER job_snapshot_insert_delete AFTER INSERT OR DELETE ON scheduler_job "
    "FOR EACH ROW EXECUTE FUNCTION scheduler_job_changed()",
    "CREATE TRIGGER job_snapshot_update AFTER UPDATE ON scheduler_job FOR EACH ROW WHEN ("
    f"{_row('OLD', JOB_COLUMNS)} IS DISTINCT FROM {_row('NEW', JOB_COLUMNS)} "
    "OR (OLD.reason IS DISTINCT FROM NEW.reason "
    "AND current_setting('portal.snapshot_quiet', true) IS DISTINCT FROM 'on')) "
    "EXECUTE FUNCTION scheduler_job_changed()",
    "CREATE TRIGGER attempt_snapshot_insert_delete AFTER INSERT OR DELETE "
    "ON scheduler_jobattempt FOR EACH ROW EXECUTE FUNCTION scheduler_attempt_changed()",
    "CREATE TRIGGER attempt_snapshot_update AFTER UPDATE ON scheduler_jobattempt FOR EACH ROW "
    f"WHEN ({_row('OLD', ATTEMPT_COLUMNS)} IS DISTINCT FROM {_row('NEW', ATTEMPT_COLUMNS)}) "
    "EXECUTE FUNCTION scheduler_attempt_changed()",
    "CREATE TRIGGER job_snapshot_truncate AFTER TRUNCATE ON scheduler_job "
    "FOR EACH STATEMENT EXECUTE FUNCTION scheduler_snapshot_forget()",
    "CREATE TRIGGER attempt_snapshot_truncate AFTER TRUNCATE ON scheduler_jobattempt "
    "FOR EACH STATEMENT EXECUTE FUNCTION scheduler_snapshot_forget()",
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS job_snapshot_insert_delete ON scheduler_job",
    "DROP TRIGGER IF EXISTS job_snapshot_update ON scheduler_job",
    "DROP TRIGGER IF EXISTS job_snapshot_truncate ON scheduler_job",
    "DROP TRIGGER IF EXISTS attempt_snapshot_insert_delete ON scheduler_jobattempt",
    "DROP TRIGGER IF EXISTS attempt_snapshot_update ON scheduler_jobattempt",
    "DROP TRIGGER IF EXISTS attempt_snapshot_truncate ON scheduler_jobattempt",
    "DROP FUNCTION IF EXISTS scheduler_job_changed()",
    "DROP FUNCTION IF EXISTS scheduler_attempt_changed()",
    "DROP FUNCTION IF EXISTS scheduler_snapshot_forget()",
    "DROP TABLE IF EXISTS scheduler_snapshotchange",
    "DROP TABLE IF EXISTS scheduler_snapshotstate",
]

# SQLite has no TRUNCATE (Django's flush deletes rows, which the row triggers see) and one
# writer at a time; every change of a reason is recorded.
_JOB_ROW = (*JOB_COLUMNS, "reason")
_JOB_ROW_CHANGED = f"{_row('OLD', _JOB_ROW)} IS NOT {_row('NEW', _JOB_ROW)}"
SQLITE = [
    "CREATE TABLE scheduler_snapshotchange "
    "(id integer PRIMARY KEY AUTOINCREMENT, job_id bigint NOT NULL)",
    "CREATE TABLE scheduler_snapshotstate (id integer PRIMARY KEY, token varchar(64) NOT NULL)",
    "CREATE TRIGGER job_snapshot_insert AFTER INSERT ON scheduler_job BEGIN "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.id); END",
    "CREATE TRIGGER job_snapshot_delete AFTER DELETE ON scheduler_job BEGIN "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.id); END",
    f"CREATE TRIGGER job_snapshot_update AFTER UPDATE ON scheduler_job WHEN {_JOB_ROW_CHANGED} "
    "BEGIN INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.id); END",
    "CREATE TRIGGER attempt_snapshot_insert AFTER INSERT ON scheduler_jobattempt BEGIN "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.job_id); END",
    "CREATE TRIGGER attempt_snapshot_delete AFTER DELETE ON scheduler_jobattempt BEGIN "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.job_id); END",
    "CREATE TRIGGER attempt_snapshot_update AFTER UPDATE ON scheduler_jobattempt WHEN "
    f"{_row('OLD', ATTEMPT_COLUMNS)} IS NOT {_row('NEW', ATTEMPT_COLUMNS)} BEGIN "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.job_id); "
    "INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.job_id); END",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS job_snapshot_insert",
    "DROP TRIGGER IF EXISTS job_snapshot_delete",
    "DROP TRIGGER IF EXISTS job_snapshot_update",
    "DROP TRIGGER IF EXISTS attempt_snapshot_insert",
    "DROP TRIGGER IF EXISTS attempt_snapshot_delete",
    "DROP TRIGGER IF EXISTS attempt_snapshot_update",
    "DROP TABLE IF EXISTS scheduler_snapshotchange",
    "DROP TABLE IF EXISTS scheduler_snapshotstate",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        statements = statements_by_vendor.get(schema_editor.connection.vendor)
        if statements is None:
            raise RuntimeError(
                f"no snapshot change feed for {schema_editor.connection.vendor}: the cycle "
                "could not keep its snapshot"
            )
        for statement in statements:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0004_job_share_index_in_job_share_recent"),
    ]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}),
        )
    ]
