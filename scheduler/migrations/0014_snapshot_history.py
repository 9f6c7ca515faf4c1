"""The change feed's history: each cycle's load of the feed (scheduler/cycle/snapshot.py) leaves
a row with its token, the token it found (the load before it, in whichever worker process),
and the jobs it read from the feed or whose reasons it wrote without recording them. A worker
whose kept snapshot another process's cycles brought up to date reads again only the jobs the
rows since its own token name, instead of everything; the Celery worker's processes take the
cycles in turn, so before this most cycles of a busy cluster read everything."""

from django.db import migrations

TABLE = "scheduler_snapshothistory"
STATEMENTS = {
    "postgresql": [
        f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, token varchar(64) NOT NULL UNIQUE, "
        "previous varchar(64), job_ids text NOT NULL)"
    ],
    "sqlite": [
        f"CREATE TABLE {TABLE} (id integer PRIMARY KEY AUTOINCREMENT, "
        "token varchar(64) NOT NULL UNIQUE, previous varchar(64), job_ids text NOT NULL)"
    ],
}


def create(apps, schema_editor):
    for statement in STATEMENTS[schema_editor.connection.vendor]:
        schema_editor.execute(statement)


def drop(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0013_job_working_dir"),
    ]

    operations = [migrations.RunPython(create, drop)]
