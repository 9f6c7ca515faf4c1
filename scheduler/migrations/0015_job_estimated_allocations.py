"""The GPUs a waiting job is estimated to start on (`estimated_allocations`, [{node,
gpu_indices}]), beside its estimated start and nodes. On SQLite, adding the column rebuilds the
job table, which drops its change-feed triggers: they are made again after it, both ways, by
migration 0013's function."""

import importlib

from django.db import migrations, models

_again = importlib.import_module(
    "scheduler.migrations.0013_job_working_dir"
).sqlite_feed_triggers_again


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0014_snapshot_history"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, _again),
        migrations.AddField(
            model_name="job",
            name="estimated_allocations",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(_again, migrations.RunPython.noop),
    ]
