"""A few common SageMaker instance types as the GPUs they stand for (AWS's published
configurations); the admin edits the table for the portal's own GPU type names."""

from django.db import migrations

INSTANCE_TYPES = [
    ("ml.p5.48xlarge", "h100", 8),
    ("ml.p5e.48xlarge", "h200", 8),
    ("ml.p5en.48xlarge", "h200", 8),
    ("ml.p4d.24xlarge", "a100", 8),
    ("ml.p4de.24xlarge", "a100-80g", 8),
    ("ml.p3.16xlarge", "v100", 8),
    ("ml.g5.xlarge", "a10g", 1),
    ("ml.g5.12xlarge", "a10g", 4),
    ("ml.g5.48xlarge", "a10g", 8),
    ("ml.g6.xlarge", "l4", 1),
    ("ml.g6.48xlarge", "l4", 8),
    ("ml.g6e.xlarge", "l40s", 1),
    ("ml.g6e.48xlarge", "l40s", 8),
]


def seed(apps, schema_editor):
    InstanceType = apps.get_model("awsbatch", "InstanceType")
    for name, gpu_type, gpus in INSTANCE_TYPES:
        InstanceType.objects.get_or_create(name=name, defaults={"gpu_type": gpu_type, "gpus": gpus})


def unseed(apps, schema_editor):
    InstanceType = apps.get_model("awsbatch", "InstanceType")
    InstanceType.objects.filter(name__in=[name for name, _, _ in INSTANCE_TYPES]).delete()


class Migration(migrations.Migration):
    dependencies = [("awsbatch", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
