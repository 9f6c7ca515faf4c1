"""The change feed (migration 0005) records a change of an attempt's checkpoint too: the
snapshot reads it (the work a preemption would lose, scheduler/engine/victims.py). The attempt
update trigger is made again with the column added, on both databases."""

from django.db import migrations

# The attempt columns the snapshot reads (scheduler/cycle/snapshot.py), as of this migration.
ATTEMPT_COLUMNS = (
    "job_id", "number", "allocations", "borrowed_gpus", "scheduled_at", "started_at",
    "stop_requested_at", "ended_at", "outcome", "preempted_for_id", "last_checkpoint_at",
)  # fmt: skip
BEFORE = ATTEMPT_COLUMNS[:-1]  # migration 0005's


def _row(prefix: str, columns) -> str:
    return "(" + ", ".join(f"{prefix}.{column}" for column in columns) + ")"


def _postgresql(columns) -> list[str]:
    return [
        "DROP TRIGGER IF EXISTS attempt_snapshot_update ON scheduler_jobattempt",
        "CREATE TRIGGER attempt_snapshot_update AFTER UPDATE ON scheduler_jobattempt FOR EACH "
        f"ROW WHEN ({_row('OLD', columns)} IS DISTINCT FROM {_row('NEW', columns)}) "
        "EXECUTE FUNCTION scheduler_attempt_changed()",
    ]


def _sqlite(columns) -> list[str]:
    return [
        "DROP TRIGGER IF EXISTS attempt_snapshot_update",
        "CREATE TRIGGER attempt_snapshot_update AFTER UPDATE ON scheduler_jobattempt WHEN "
        f"{_row('OLD', columns)} IS NOT {_row('NEW', columns)} BEGIN "
        "INSERT INTO scheduler_snapshotchange (job_id) VALUES (OLD.job_id); "
        "INSERT INTO scheduler_snapshotchange (job_id) VALUES (NEW.job_id); END",
    ]


def _run(columns):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        statements = {"postgresql": _postgresql, "sqlite": _sqlite}.get(vendor)
        if statements is None:
            raise RuntimeError(f"no snapshot change feed for {vendor}")
        for statement in statements(columns):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0008_checkpoints_and_churn"),
    ]

    operations = [migrations.RunPython(_run(ATTEMPT_COLUMNS), _run(BEFORE))]
