"""Whether a node's agent asks the portal before it starts an attempt (`Node.asks_to_start`):
agents say so when they register, connectors' nodes always do. Nodes registered before this
migration start as not asking until their agent registers again. On SQLite the node table is
rebuilt; it has no change-feed trigger (tests/db checks them)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("scheduler", "0016_job_estimated_nodes_from_allocations"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="asks_to_start",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "Its agent (or connector) starts an attempt only once the portal granted "
                    "it, so an attempt preempted before its start was granted ends at once."
                ),
            ),
        ),
    ]
