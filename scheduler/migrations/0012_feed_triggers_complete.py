"""The change feed's triggers (migration 0005), made whole again.

- On SQLite, a migration that rebuilds a table (SQLite alters most columns by copying the table
  into a new one) drops the table's triggers. Migrations 0006 to 0011 rebuilt the job and attempt
  tables, so SQLite kept only the attempt update trigger that 0009 made again: every cycle there
  read the whole queue (the feed's incomplete triggers say so), and no change feed was kept.
  Every SQLite trigger is made again here. A later migration that rebuilds either table must do
  the same (tests/db/test_feed_triggers.py runs the migrations on SQLite and checks).
- On both databases, the job update trigger now also watches `preemptible` and
  `preemption_count`, which the snapshot reads since migrations 0007 and 0008.
"""

from django.db import migrations

# The columns of a job and of an attempt the snapshot reads (scheduler/cycle/snapshot.py), as of
# this migration.
JOB_COLUMNS = (
    "state", "share_id", "gpu_type", "gpus", "nodes", "priority", "submitted_at", "attempt_count",
    "preemptible", "preemption_count",
)  # fmt: skip
JOB_COLUMNS_BEFORE = JOB_COLUMNS[:-2]  # migration 0005's
ATTEMPT_COLUMNS = (
    "job_id", "number", "allocations", "borrowed_gpus", "scheduled_at", "started_at",
    "stop_requested_at", "ended_at", "outcome", "preempted_for_id", "last_checkpoint_at",
)  # fmt: skip


def _row(prefix: str, columns) -> str:
    return "(" + ", ".join(f"{prefix}.{column}" for column in columns) + ")"


def _postgresql(job_columns) -> list[str]:
    return [
        "DROP TRIGGER IF EXISTS job_snapshot_update ON scheduler_job",
        "CREATE TRIGGER job_snapshot_update AFTER UPDATE ON scheduler_job FOR EACH ROW WHEN ("
        f"{_row('OLD', job_columns)} IS DISTINCT FROM {_row('NEW', job_columns)} "
        "OR (OLD.reason IS DISTINCT FROM NEW.reason "
        "AND current_setting('portal.snapshot_quiet', true) IS DISTINCT FROM 'on')) "
        "EXECUTE FUNCTION scheduler_job_changed()",
    ]


def _sqlite(job_columns) -> list[str]:
    # SQLite has no TRUNCATE and one writer at a time; every change of a reason is recorded.
    job_row = (*job_columns, "reason")
    insert = "INSERT INTO scheduler_snapshotchange (job_id) VALUES"
    triggers = {
        "job_snapshot_insert": f"AFTER INSERT ON scheduler_job BEGIN {insert} (NEW.id); END",
        "job_snapshot_delete": f"AFTER DELETE ON scheduler_job BEGIN {insert} (OLD.id); END",
        "job_snapshot_update": (
            f"AFTER UPDATE ON scheduler_job WHEN {_row('OLD', job_row)} IS NOT "
            f"{_row('NEW', job_row)} BEGIN {insert} (NEW.id); END"
        ),
        "attempt_snapshot_insert": (
            f"AFTER INSERT ON scheduler_jobattempt BEGIN {insert} (NEW.job_id); END"
        ),
        "attempt_snapshot_delete": (
            f"AFTER DELETE ON scheduler_jobattempt BEGIN {insert} (OLD.job_id); END"
        ),
        "attempt_snapshot_update": (
            f"AFTER UPDATE ON scheduler_jobattempt WHEN {_row('OLD', ATTEMPT_COLUMNS)} IS NOT "
            f"{_row('NEW', ATTEMPT_COLUMNS)} BEGIN {insert} (OLD.job_id); "
            f"{insert} (NEW.job_id); END"
        ),
    }
    statements = []
    for name, body in triggers.items():
        statements += [f"DROP TRIGGER IF EXISTS {name}", f"CREATE TRIGGER {name} {body}"]
    return statements


def _run(job_columns):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        statements = {"postgresql": _postgresql, "sqlite": _sqlite}.get(vendor)
        if statements is None:
            raise RuntimeError(f"no snapshot change feed for {vendor}")
        for statement in statements(job_columns):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0011_job_image_kubernetes"),
    ]

    operations = [migrations.RunPython(_run(JOB_COLUMNS), _run(JOB_COLUMNS_BEFORE))]
