"""The GPUs a waiting job is estimated to start on (`estimated_allocations`, [{node,
gpu_indices}]), beside its estimated start and nodes. On SQLite, adding the column rebuilds the
job table, which drops its change-feed triggers: they are made again after it, both ways, as
migration 0013 does."""

import importlib

from django.db import migrations, models

_feed = importlib.import_module("scheduler.migrations.0012_feed_triggers_complete")


def sqlite_feed_triggers_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in _feed._sqlite(_feed.JOB_COLUMNS):
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0014_snapshot_history"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_feed_triggers_again),
        migrations.AddField(
            model_name="job",
            name="estimated_allocations",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(sqlite_feed_triggers_again, migrations.RunPython.noop),
    ]
