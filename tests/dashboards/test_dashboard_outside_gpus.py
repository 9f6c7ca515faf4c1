"""GPUs used outside the portal (a Slurm node's GPUs that Slurm's own jobs hold) on the
dashboards and /metrics: shown as their own figure, never counted as capacity, so a lead sees
why the capacity shrank."""

from __future__ import annotations

import re

import pytest

from dashboards import figures
from dashboards.models import ClusterSample
from dashboards.selectors import cluster_now
from dashboards.services import history_sample
from scheduler.models import Connector, Node
from tests.conftest import make_node
from tests.dashboards.test_dashboard_metrics import scrape


def nodes_table(page: str) -> list[list[str]]:
    """The cells of the overview's table of nodes holding GPUs back, row by row."""
    table = re.search(r'<table class="nodes">(.*?)</table>', page, re.S).group(1)
    return [
        [cell.strip() for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    ]


@pytest.fixture
def cluster(db, vision_share, research_share):
    """Four 8-GPU h100 nodes: n0 and n1 run by agents, sn1 by connector `slurm`, where Slurm's
    own jobs hold 6 GPUs; and sn2, DOWN in Slurm, whose GPUs Slurm's jobs held when it went.
    vision (LEND) and research (LEND_AND_BORROW) each have a limit of 8 h100, all idle."""
    slurm = Connector.objects.create(name="slurm", kind=Connector.Kind.SLURM)
    make_node("n0")
    make_node("n1")
    make_node("sn1", connector=slurm, outside_gpus=6)
    make_node(
        "sn2", connector=slurm, state=Node.State.DOWN, state_reason="Slurm: down (not responding)",
        outside_gpus=8,
    )  # fmt: skip


@pytest.mark.django_db
def test_gpus_used_outside_the_portal_are_shown_beside_a_capacity_without_them(cluster):
    """24 GPUs on READY nodes, 6 of them used outside the portal: capacity 18, and of the
    free pool (18 − 16 covered by limits) only 2 are idle for borrowers, plus the shares' 16
    idle lendable GPUs. A DOWN node's GPUs count as down, whatever held them."""
    h100, l4 = cluster_now()
    assert (l4.gpu_type, l4.capacity, l4.outside) == ("l4", 0, 0)
    assert (h100.capacity, h100.outside, h100.down, h100.in_use) == (18, 6, 8, 0)
    assert h100.idle_lendable == 18


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["root", "carol"])
def test_the_overview_shows_what_is_used_outside_the_portal(client, cluster, persona, request):
    """An admin and a team lead see, for h100, the 6 GPUs used outside the portal beside a
    capacity of 18, and the nodes that hold GPUs back, most first: sn2 (all 8, DOWN) with
    Slurm's reason, then sn1 with its 6; not the agents' nodes, which give the portal all
    their GPUs."""
    client.force_login(request.getfixturevalue(persona))
    page = client.get("/dash/").content.decode()
    assert "<b>0</b> / 18 GPUs in use" in page
    assert "<b>6</b> used outside the portal" in page
    header, *rows = nodes_table(page)
    assert header[3] == "used outside the portal"
    assert rows == [
        ["sn2", "h100", "8", "8", "DOWN", "Slurm: down (not responding)", "slurm"],
        ["sn1", "h100", "8", "6", "READY", "—", "slurm"],
    ]
    assert '"name":"used outside the portal"' in page  # the capacity figure's bar


@pytest.mark.django_db
def test_a_cluster_without_outside_gpus_has_no_such_bar_or_nodes_holding_back(client, root):
    make_node("n0")
    client.force_login(root)
    page = client.get("/dash/").content.decode()
    assert "used outside the portal</p>" not in page
    assert '"name":"used outside the portal"' not in page
    assert nodes_table(page)[1:] == [["Every node is READY and gives all its GPUs to the portal."]]


@pytest.mark.django_db
def test_the_capacity_figure_has_a_bar_of_gpus_used_outside_the_portal(cluster):
    """Its own bar, after `in use`, with each GPU type's GPUs used outside the portal; and a
    figure plotly's graph objects accept."""
    import plotly.graph_objects as go

    fig = figures.capacity_now(cluster_now())
    go.Figure(fig)
    assert fig["data"][0]["x"] == ["h100", "l4"]
    bars = {trace["name"]: trace["y"] for trace in fig["data"]}
    assert list(bars) == [
        "capacity (nodes up)", "in use", "used outside the portal", "idle, lendable", "down",
    ]  # fmt: skip
    assert (bars["capacity (nodes up)"], bars["used outside the portal"]) == ([18, 0], [6, 0])


@pytest.mark.django_db
def test_history_records_the_capacity_without_the_gpus_used_outside_the_portal(cluster):
    """The overview's dashed capacity line over time is what the portal can plan on, as on
    its cards."""
    assert history_sample()
    sample = ClusterSample.objects.get(gpu_type="h100")
    assert (sample.capacity, sample.down) == (18, 8)


@pytest.mark.django_db
def test_metrics_report_the_gpus_used_outside_the_portal_per_gpu_type(client, cluster):
    """6 h100 used outside the portal (not those of the DOWN node, which are down); 0 for a
    type whose nodes hold nothing outside."""
    make_node("l4-0", gpu_type="l4", gpus=4)
    m = scrape(client)
    assert m[("portal_node_outside_gpus", (("resource", "h100"),))] == 6
    assert m[("portal_node_outside_gpus", (("resource", "l4"),))] == 0
    assert m[("portal_node_gpus", (("resource", "h100"), ("state", "READY")))] == 24
