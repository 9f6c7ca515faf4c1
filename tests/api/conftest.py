"""The people and things every API test talks about.

carol leads the lender team vision, alice leads the borrower team ml-research, bob is a member
of ml-research, oscar is an outsider, root is the admin. Share `vision` (LEND, 8 h100) belongs
to vision; share `research` (LEND_AND_BORROW, 8 h100 and 2 l4) to ml-research; share
`inference` (RESERVE, 4 l4) to a team none of them is on. Two 8-GPU h100 nodes and one 4-GPU
l4 node are READY."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.models import Node
from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create

PERSONAS = ("root", "carol", "alice", "bob", "oscar")


@dataclass
class World:
    users: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    shares: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)

    def client(self, persona: str | None) -> APIClient:
        """An API client authenticated with the persona's token (None: anonymous)."""
        client = APIClient()
        if persona is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[persona]}")
        return client


def build_world() -> World:
    User = get_user_model()
    world = World()
    world.users["root"] = User.objects.create_user(
        "root", password="pw", is_staff=True, is_superuser=True
    )
    for name in ("carol", "alice", "bob", "oscar", "dave"):
        world.users[name] = User.objects.create_user(name, password="pw")
    vision = Team.objects.create(name="Vision", slug="vision")
    research = Team.objects.create(name="ML Research", slug="ml-research")
    inference = Team.objects.create(name="Inference", slug="inference")
    Membership.objects.create(team=vision, user=world.users["carol"], role=Membership.Role.LEAD)
    Membership.objects.create(team=research, user=world.users["alice"], role=Membership.Role.LEAD)
    Membership.objects.create(team=research, user=world.users["bob"], role=Membership.Role.MEMBER)
    Membership.objects.create(team=inference, user=world.users["dave"], role=Membership.Role.LEAD)
    command = {"actor": world.users["root"], "source": ShareChange.Source.COMMAND}
    world.shares["vision"] = share_create(
        name="vision",
        team=vision,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND,
        grace_seconds=10,
        **command,
    )
    world.shares["research"] = share_create(
        name="research",
        team=research,
        capacity_limits={"h100": 8, "l4": 2},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
        **command,
    )
    world.shares["inference"] = share_create(
        name="inference",
        team=inference,
        capacity_limits={"l4": 2},
        strategy=QuotaShare.Strategy.RESERVE,
        **command,
    )
    for name, gpu_type, gpus in (("h100-0", "h100", 8), ("h100-1", "h100", 8), ("l4-0", "l4", 4)):
        world.nodes[name] = Node.objects.create(name=name, gpu_type=gpu_type, gpus=gpus)
    for persona in PERSONAS:
        world.tokens[persona] = Token.objects.create(user=world.users[persona]).key
    return world


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Tests create many users; the production hasher takes most of a second each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(db) -> World:
    return build_world()


def job_request(**overrides) -> dict:
    """A valid submit body for share `research`; override any field."""
    return {
        "name": "train",
        "share": "research",
        "gpu_type": "h100",
        "gpus": 8,
        "command": "python train.py",
        **overrides,
    }
