"""The one world every test talks about.

carol leads the lender team vision (slug `vision`), which owns share `vision`: LEND, 8 h100,
grace 2 s. alice leads the borrower team ML Research (slug `ml-research`), which owns share
`research`: LEND_AND_BORROW, 8 h100 and 2 l4, no borrow cap, grace 2 s. bob is a plain member
of ML Research. oscar is an outsider: on no team. root is the admin (a superuser).

Ask for one piece at a time (`carol`, `vision_share`, ...), which creates only it and what it
needs, or for the whole `world` (all five personas and both shares, plus API tokens on demand).
Every persona's password is `password_of(name)`. Nodes are not part of the world: tests create
the ones they need with `make_node` (the API tests' `world` adds a cluster of three)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.attempts import attempt_started
from scheduler.nodes.services import node_orders
from scheduler.nodes.views import decided_starts
from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create

PERSONAS = ("root", "carol", "alice", "bob", "oscar")


def password_of(persona: str) -> str:
    return f"pw-{persona}-1234"


def create_team(slug: str) -> Team:
    """Team `vision` (the lender) or `ml-research` (the borrower)."""
    names = {"vision": "Vision", "ml-research": "ML Research"}
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": names[slug]})
    return team


def create_persona(name: str):
    """One of PERSONAS with their team membership (creating the team if need be)."""
    User = get_user_model()
    if name == "root":
        return User.objects.create_superuser("root", "root@example.com", password_of("root"))
    user = User.objects.create_user(name, password=password_of(name))
    team_and_role = {
        "carol": ("vision", Membership.Role.LEAD),
        "alice": ("ml-research", Membership.Role.LEAD),
        "bob": ("ml-research", Membership.Role.MEMBER),
    }
    if name in team_and_role:
        slug, role = team_and_role[name]
        Membership.objects.create(team=create_team(slug), user=user, role=role)
    return user


def create_share(name: str) -> QuotaShare:
    """Share `vision` (the lender's) or `research` (the borrower's), as the module docstring
    describes them."""
    if name == "vision":
        return share_create(
            name="vision",
            team=create_team("vision"),
            capacity_limits={"h100": 8},
            strategy=QuotaShare.Strategy.LEND,
            grace_seconds=2,
            source=ShareChange.Source.COMMAND,
        )
    assert name == "research", name
    return share_create(
        name="research",
        team=create_team("ml-research"),
        capacity_limits={"h100": 8, "l4": 2},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
        grace_seconds=2,
        source=ShareChange.Source.COMMAND,
    )


class _Tokens(Mapping):
    """API token keys by persona, created on first use."""

    def __init__(self, users: dict) -> None:
        self.users = users

    def __getitem__(self, persona: str) -> str:
        return Token.objects.get_or_create(user=self.users[persona])[0].key

    def __iter__(self) -> Iterator[str]:
        return iter(self.users)

    def __len__(self) -> int:
        return len(self.users)


@dataclass
class World:
    """The five personas and the two shares; `users`, `shares` and `tokens` look them up by
    name, `nodes` holds the nodes a test put in it."""

    users: dict = field(default_factory=dict)
    shares: dict = field(default_factory=dict)
    nodes: dict = field(default_factory=dict)

    @property
    def tokens(self) -> Mapping[str, str]:
        return _Tokens(self.users)

    def __getattr__(self, name: str):
        # world.carol, world.vision, ...
        for table in ("users", "shares"):
            found = self.__dict__.get(table, {})
            if name in found:
                return found[name]
        raise AttributeError(name)

    def client(self, persona: str | None) -> APIClient:
        """An API client authenticated with the persona's token (None: anonymous)."""
        client = APIClient()
        if persona is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[persona]}")
        return client


def build_world() -> World:
    """The whole world, for tests that manage their own database (transactional ones)."""
    return World(
        users={name: create_persona(name) for name in PERSONAS},
        shares={name: create_share(name) for name in ("vision", "research")},
    )


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Tests create many users; the production hasher takes most of a second each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_decided_starts():
    """What a web process remembers of decided starts is about attempt ids, which a database
    rolled back after a test (SQLite) gives out again."""
    decided_starts.forget()


@pytest.fixture
def vision_team(db) -> Team:
    """The lender team, led by carol."""
    return create_team("vision")


@pytest.fixture
def research_team(db) -> Team:
    """The borrower team ML Research, led by alice, with bob as a member."""
    return create_team("ml-research")


@pytest.fixture
def root(db):
    """The admin: a superuser on no team."""
    return create_persona("root")


@pytest.fixture
def carol(vision_team):
    """Lead of the lender team vision."""
    return create_persona("carol")


@pytest.fixture
def alice(research_team):
    """Lead of the borrower team ML Research."""
    return create_persona("alice")


@pytest.fixture
def bob(research_team):
    """A plain member (not lead) of the borrower team ML Research."""
    return create_persona("bob")


@pytest.fixture
def oscar(db):
    """An outsider: on no team, not an admin."""
    return create_persona("oscar")


@pytest.fixture
def vision_share(vision_team) -> QuotaShare:
    """The lender's share: LEND, 8 h100, grace 2 s."""
    return create_share("vision")


@pytest.fixture
def research_share(research_team) -> QuotaShare:
    """The borrower's share: LEND_AND_BORROW, 8 h100 and 2 l4, no borrow cap, grace 2 s."""
    return create_share("research")


@pytest.fixture
def world(root, carol, alice, bob, oscar, vision_share, research_share) -> World:
    """All five personas and both shares, by name: `world.alice`, `world.users["bob"]`,
    `world.shares["research"]`, `world.tokens["bob"]`, `world.client("bob")`."""
    return World(
        users={"root": root, "carol": carol, "alice": alice, "bob": bob, "oscar": oscar},
        shares={"vision": vision_share, "research": research_share},
    )


def make_node(name: str, gpu_type: str = "h100", gpus: int = 8, **fields) -> Node:
    return Node.objects.create(
        name=name, gpu_type=gpu_type, gpus=gpus, last_heartbeat=timezone.now(), **fields
    )


def place_a_borrower(world: World) -> tuple[Job, JobAttempt]:
    """On two 8-GPU nodes: alice's first 8-GPU job takes research's own quota, her second one
    borrows vision's idle GPUs; returns the borrower and its attempt."""
    for _ in range(2):
        borrower, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100",
                                 gpus=8, command="sleep 60")  # fmt: skip
        cycle_run(force=True)
    attempt = JobAttempt.objects.get(job=borrower)
    assert attempt.borrowed_gpus == 8
    return borrower, attempt


def start_latest_attempt(job) -> None:
    """The job's agents receive their orders and start its latest attempt, on every node."""
    attempt = JobAttempt.objects.filter(job=job).order_by("-number").first()
    for allocation in attempt.allocations:
        node = Node.objects.get(name=allocation["node"])
        node_orders(node=node)
        attempt_started(node=node, attempt_id=attempt.pk)


@pytest.fixture
def live(request, tmp_path, transactional_db):
    """Start real processes with `live.start(...)`; they are stopped, and their logs printed on
    failure, at the end of the test."""
    from tests.live import LiveSystem

    systems: list[LiveSystem] = []

    def make(**env: str) -> LiveSystem:
        system = LiveSystem(tmp_path, **env)
        systems.append(system)
        return system

    yield make
    for system in systems:
        system.stop_all()
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(system.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
