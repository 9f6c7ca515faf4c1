"""A job's working directory (`working_dir`). On SQLite, adding the column rebuilds the job table,
which drops its change-feed triggers: they are made again after it, both ways (see migration
0012 and tests/db/test_feed_triggers.py)."""

import importlib

from django.db import migrations, models

import scheduler.models

# The triggers as migration 0012 made them: the columns the snapshot reads are the same.
_feed = importlib.import_module("scheduler.migrations.0012_feed_triggers_complete")


def sqlite_feed_triggers_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in _feed._sqlite(_feed.JOB_COLUMNS):
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0012_feed_triggers_complete"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_feed_triggers_again),
        migrations.AddField(
            model_name="job",
            name="working_dir",
            field=models.CharField(
                blank=True,
                help_text="The directory the command starts in, an absolute path on the node (in "
                "the container on Kubernetes nodes); blank: the job's checkpoint directory.",
                max_length=1024,
                validators=[scheduler.models.validate_working_dir],
            ),
        ),
        migrations.RunPython(sqlite_feed_triggers_again, migrations.RunPython.noop),
    ]
