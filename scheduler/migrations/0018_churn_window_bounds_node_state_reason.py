"""The churn breaker's window is bounded on the model (1 s to 90 days), not only in the admin's
form; a node's state_reason also records who drained or undrained it and why. Validators and
help texts only: no SQL (tests/db checks the change-feed triggers)."""

import django.core.validators
from django.db import migrations, models

CHURN_WINDOW_RANGE = (
    "churn_window_seconds: must be a whole number between 1 and 7776000 seconds (90 days)."
)


class Migration(migrations.Migration):

    dependencies = [
        ("scheduler", "0017_node_asks_to_start"),
    ]

    operations = [
        migrations.AlterField(
            model_name="clustersettings",
            name="churn_window_seconds",
            field=models.PositiveIntegerField(
                default=3600,
                help_text="The churn breaker's window, in seconds (1 to 7776000, 90 days).",
                validators=[
                    django.core.validators.MinValueValidator(1, message=CHURN_WINDOW_RANGE),
                    django.core.validators.MaxValueValidator(7776000, message=CHURN_WINDOW_RANGE),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="node",
            name="state_reason",
            field=models.CharField(
                blank=True,
                help_text=(
                    "Why the node is in its state: as its cluster says, or who drained or "
                    "undrained it and why (`node_set_state`)."
                ),
                max_length=300,
            ),
        ),
    ]
