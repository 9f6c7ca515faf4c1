"""A job's env is checked by the model (scheduler.models.validate_env) on every way a job comes
in, not only by the REST API's serializer. A validator only: no SQL."""

from django.db import migrations, models

import scheduler.models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0018_churn_window_bounds_node_state_reason"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="env",
            field=models.JSONField(
                blank=True, default=dict, validators=[scheduler.models.validate_env]
            ),
        ),
    ]
