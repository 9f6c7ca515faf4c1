"""The cycle duration histogram's buckets move from one JSON field to a column each, so that
`cycle_record` counts a cycle with one UPDATE; the counts so far move with them."""

from django.db import migrations, models

# The buckets as they were keyed in the JSON field, and the column of each: fixed here, as
# this migration found them.
BUCKETS = {
    "0.005": "le_0_005",
    "0.01": "le_0_01",
    "0.025": "le_0_025",
    "0.05": "le_0_05",
    "0.1": "le_0_1",
    "0.25": "le_0_25",
    "0.5": "le_0_5",
    "1.0": "le_1_0",
    "2.5": "le_2_5",
    "5.0": "le_5_0",
    "10.0": "le_10_0",
    "+Inf": "le_inf",
}


def to_columns(apps, schema_editor):
    CycleStats = apps.get_model("dashboards", "CycleStats")
    for stats in CycleStats.objects.all():
        for key, column in BUCKETS.items():
            setattr(stats, column, stats.buckets.get(key, 0))
        stats.save()


def to_json(apps, schema_editor):
    CycleStats = apps.get_model("dashboards", "CycleStats")
    for stats in CycleStats.objects.all():
        stats.buckets = {
            key: getattr(stats, column) for key, column in BUCKETS.items() if getattr(stats, column)
        }
        stats.save()


class Migration(migrations.Migration):
    dependencies = [
        ("dashboards", "0001_initial"),
    ]

    operations = [
        *(
            migrations.AddField(
                model_name="cyclestats",
                name=column,
                field=models.PositiveBigIntegerField(default=0),
            )
            for column in BUCKETS.values()
        ),
        migrations.RunPython(to_columns, to_json),
        migrations.RemoveField(model_name="cyclestats", name="buckets"),
    ]
