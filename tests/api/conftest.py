"""The API tests use the one world of tests/conftest.py (carol leads the lender team vision,
alice leads the borrower team ml-research, bob is a member of ml-research, oscar is an
outsider, root is the admin), on a cluster of two 8-GPU h100 nodes and one 4-GPU l4 node,
all READY; root set up both shares. Tests that need a third share ask for `inference_share`."""

from __future__ import annotations

import pytest

from shares.models import QuotaShare, ShareChange, Team
from shares.services import share_create
from tests.api.helpers import add_cluster
from tests.conftest import World


@pytest.fixture
def world(world) -> World:
    """The shared world, with the cluster's nodes in `world.nodes` ("h100-0", "h100-1",
    "l4-0")."""
    add_cluster(world)
    # Shares here were set up by the admin, so their history names who made them.
    ShareChange.objects.filter(changed_by=None).update(changed_by=world.root)
    return world


@pytest.fixture
def inference_share(world) -> QuotaShare:
    """A third share, `inference` (RESERVE, 2 l4), of a team none of the personas is on."""
    team = Team.objects.create(name="Inference", slug="inference")
    share = share_create(
        name="inference",
        team=team,
        capacity_limits={"l4": 2},
        strategy=QuotaShare.Strategy.RESERVE,
        actor=world.root,
        source=ShareChange.Source.COMMAND,
    )
    world.shares["inference"] = share
    return share
