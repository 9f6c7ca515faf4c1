"""A waiting job's estimated nodes are its estimated allocations' nodes (`Job.estimated_nodes`,
a property): the column that repeated them goes. On SQLite, Django drops the column with ALTER
TABLE DROP COLUMN, without rebuilding the job table, so its change-feed triggers stay
(tests/db checks them)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("scheduler", "0015_job_estimated_allocations"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="job",
            name="estimated_nodes",
        ),
    ]
