"""Personas shared by the tests.

One by one: carol leads the lender team vision, alice leads the borrower team ml-research, bob is a
member of ml-research, oscar is an outsider, root is the admin.

As one bundle (`personas`, for the cycle and agent tests): vera leads the lender team (share
`vision`, LEND, 8 h100, grace 2 s); bruno leads the borrower team (share `research`,
LEND_AND_BORROW, 8 h100 + 2 l4, grace 2 s); olga is an outsider; ada is the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from scheduler.models import Node
from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1234")


@pytest.fixture
def vision_team(db) -> Team:
    return Team.objects.create(name="Vision", slug="vision")


@pytest.fixture
def research_team(db) -> Team:
    return Team.objects.create(name="ML Research", slug="ml-research")


@pytest.fixture
def carol(django_user_model, vision_team):
    user = django_user_model.objects.create_user("carol", password="pw-carol-1234")
    Membership.objects.create(team=vision_team, user=user, role=Membership.Role.LEAD)
    return user


@pytest.fixture
def alice(django_user_model, research_team):
    user = django_user_model.objects.create_user("alice", password="pw-alice-1234")
    Membership.objects.create(team=research_team, user=user, role=Membership.Role.LEAD)
    return user


@pytest.fixture
def bob(django_user_model, research_team):
    user = django_user_model.objects.create_user("bob", password="pw-bob-1234")
    Membership.objects.create(team=research_team, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def oscar(django_user_model):
    return django_user_model.objects.create_user("oscar", password="pw-oscar-1234")


@pytest.fixture
def vision_share(vision_team) -> QuotaShare:
    """The lender: 8 h100, LEND."""
    return share_create(
        name="vision",
        team=vision_team,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND,
        source=ShareChange.Source.COMMAND,
    )


@pytest.fixture
def research_share(research_team) -> QuotaShare:
    """The borrower: 8 h100, LEND_AND_BORROW, no borrow cap."""
    return share_create(
        name="research",
        team=research_team,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
        source=ShareChange.Source.COMMAND,
    )


@pytest.fixture
def personas(db):
    User = get_user_model()
    lender = Team.objects.create(name="Vision", slug="vision")
    borrower = Team.objects.create(name="ML Research", slug="ml-research")
    vera = User.objects.create_user("vera")
    bruno = User.objects.create_user("bruno")
    olga = User.objects.create_user("olga")
    ada = User.objects.create_superuser("ada", password=None)
    Membership.objects.create(team=lender, user=vera, role=Membership.Role.LEAD)
    Membership.objects.create(team=borrower, user=bruno, role=Membership.Role.LEAD)
    vision = share_create(
        name="vision",
        team=lender,
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND,
        grace_seconds=2,
    )
    research = share_create(
        name="research",
        team=borrower,
        capacity_limits={"h100": 8, "l4": 2},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
        grace_seconds=2,
    )
    return type(
        "Personas",
        (),
        {
            "vera": vera,
            "bruno": bruno,
            "olga": olga,
            "ada": ada,
            "vision": vision,
            "research": research,
        },
    )


def make_node(name: str, gpu_type: str = "h100", gpus: int = 8, **fields) -> Node:
    return Node.objects.create(
        name=name, gpu_type=gpu_type, gpus=gpus, last_heartbeat=timezone.now(), **fields
    )


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
