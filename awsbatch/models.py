"""What the AWS Batch API adds to the portal: access keys to sign requests with (SigV4), and
the instance types a SageMaker request may name."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connection, models

from portal.db.sql import instance_from_row, model_columns, select_rows
from scheduler.models import MAX_GPUS_PER_NODE
from shares.models import validate_gpu_type


class AccessKey(models.Model):
    """An AWS-style access key of a user: the id is public, the secret signs requests. The
    secret is stored encrypted with a key derived from the portal's SECRET_KEY, which is not in
    the database: a copy of the database alone cannot sign (awsbatch.keys)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="aws_access_keys"
    )
    access_key_id = models.CharField(max_length=32, unique=True, editable=False)
    secret_encrypted = models.TextField(editable=False)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.access_key_id} ({self.user})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class InstanceType(models.Model):
    """An instance type a SageMaker request or a quota share's capacity limit may name, as the
    GPUs it stands for here: `ml.p5.48xlarge` → 8 × h100."""

    name = models.CharField(max_length=64, unique=True)
    gpu_type = models.CharField(max_length=32, validators=[validate_gpu_type])
    gpus = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_GPUS_PER_NODE)],
        help_text="GPUs per instance: an instance is one node with this many GPUs.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.gpus} × {self.gpu_type})"


class ShareTags(models.Model):
    """A quota share's AWS tags (CreateQuotaShare's `tags`), shown by DescribeQuotaShare."""

    share = models.OneToOneField(
        "shares.QuotaShare", on_delete=models.CASCADE, related_name="aws_tags"
    )
    tags = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"tags of {self.share_id}"


class ServiceJob(models.Model):
    """What a job submitted through SubmitServiceJob was asked as, beyond the portal's own
    fields: AWS's request (its SageMaker payload, tags, retry strategy), shown back by
    DescribeServiceJob as AWS shows it."""

    job = models.OneToOneField("scheduler.Job", on_delete=models.CASCADE, related_name="aws")
    service_job_type = models.CharField(max_length=32)
    service_request_payload = models.TextField()
    tags = models.JSONField(default=dict, blank=True)
    retry_strategy = models.JSONField(default=dict, blank=True)
    timeout_config = models.JSONField(default=dict, blank=True)
    preemption_configuration = models.JSONField(default=dict, blank=True)
    # The instance type the payload asked for, and how many: the capacity AWS reports.
    instance_type = models.CharField(max_length=64, blank=True)
    instance_count = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.service_job_type} job {self.job_id}"


def instance_type_named(name: str) -> InstanceType | None:
    """The instance type of that name: a written-out statement, prepared once per connection
    (every SubmitServiceJob looks one up)."""
    rows = select_rows(_instance_type_sql(), [name], tuple(InstanceType._meta.concrete_fields))
    return instance_from_row(InstanceType, rows[0]) if rows else None


@cache
def _instance_type_sql() -> str:
    table = connection.ops.quote_name(InstanceType._meta.db_table)
    return f"SELECT {model_columns(InstanceType, 't')} FROM {table} t WHERE t.name = %s"
