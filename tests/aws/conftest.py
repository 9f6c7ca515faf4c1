"""boto3 against a live portal: the web server, the Celery worker and fake-GPU agents on the
test database (tests/live.py), each persona with an access key. The client is AWS's own
(boto3's `batch` client, botocore's service model), pointed at the portal's /aws endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module

import boto3
import pytest
from botocore.config import Config

from awsbatch.keys import access_key_create
from awsbatch.models import InstanceType
from scheduler.models import Node
from tests.live import LiveSystem, wait_for

SEEDED_INSTANCE_TYPES = import_module("awsbatch.migrations.0002_seed_instance_types").INSTANCE_TYPES
REGION = "us-east-1"
QUEUE = "gpu-portal"


@dataclass
class AwsPortal:
    system: LiveSystem
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # persona → (id, secret)

    @property
    def endpoint(self) -> str:
        return f"{self.system.url}/aws"

    def client(self, persona: str, *, validate: bool = True, **credentials):
        """boto3's batch client signed with `persona`'s key; `validate=False` sends what
        botocore would refuse itself, to see the portal's own answer."""
        key_id, secret = self.keys[persona]
        return boto3.client(
            "batch",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=credentials.get("key_id", key_id),
            aws_secret_access_key=credentials.get("secret", secret),
            config=Config(parameter_validation=validate, retries={"max_attempts": 1}),
        )


@pytest.fixture
def aws(live, world) -> AwsPortal:
    """A live portal with two fake-GPU agents of 8 h100 each, and an access key per persona."""
    system = live()
    system.start_web()
    system.start_worker()
    for name in ("aws-a", "aws-b"):
        system.start_agent(name, 8, "h100")
    wait_for(lambda: Node.objects.filter(state=Node.State.READY).count() == 2, what="agents")
    # The instance types the seed migration made: a transactional test before this one may
    # have emptied every table.
    for name, gpu_type, gpus in SEEDED_INSTANCE_TYPES:
        InstanceType.objects.get_or_create(name=name, defaults={"gpu_type": gpu_type, "gpus": gpus})
    portal = AwsPortal(system)
    for persona, user in world.users.items():
        new = access_key_create(user=user)
        portal.keys[persona] = (new.key.access_key_id, new.secret)
    return portal
