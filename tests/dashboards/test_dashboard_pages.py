"""Dashboard pages: who may see what, the queue's order, lending flows, GPU-hours, and the
figures' traces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from dashboards.models import Resolution, UsageSample
from dashboards.selectors import (
    FREE_POOL,
    TimeRange,
    gpu_hours,
    lending_flows,
    queue_front,
    resolution_for,
    time_range_from,
    usage_history,
)
from dashboards.services import history_sample
from dashboards.views import NOT_A_LEAD
from scheduler.models import Job, JobAttempt, Node
from tests.api.helpers import place

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def job(share, user, gpus, state=Job.State.RUNNABLE, priority=0, name="", reason=""):
    return Job.objects.create(
        share=share, submitted_by=user, gpu_type="h100", gpus=gpus, command="train",
        state=state, priority=priority, name=name, reason=reason,
    )  # fmt: skip


SECONDS = {Resolution.RAW: 15, Resolution.MINUTE: 60, Resolution.HOUR: 3600}


def row(share, at, resolution=Resolution.MINUTE, *, own=0.0, borrowed=0.0, lent=0.0, limit=8):
    return UsageSample(
        resolution=resolution, at=at, share=share, gpu_type="h100", limit=limit, own=own,
        borrowed=borrowed, lent=lent, idle=max(0, limit - own - lent), demand=0,
        usage_max=own + borrowed, borrowed_max=borrowed, demand_max=0,
        seconds=SECONDS[resolution],
    )  # fmt: skip


@pytest.fixture
def cluster(db, vision_share, research_share):
    Node.objects.create(name="n0", gpu_type="h100", gpus=8)
    Node.objects.create(name="n1", gpu_type="h100", gpus=8)


# --- Access ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_pages_need_a_login(client, cluster):
    response = client.get("/dash/")
    assert response.status_code == 302 and response.url == "/dash/login/?next=/dash/"


@pytest.mark.django_db
def test_a_lead_who_is_not_staff_logs_in_on_the_dashboards_login_page(client, cluster, carol):
    response = client.post(
        "/dash/login/?next=/dash/", {"username": "carol", "password": "pw-carol-1234"}
    )
    assert response.status_code == 302 and response.url == "/dash/"
    assert client.get("/dash/").status_code == 200


@pytest.mark.django_db
def test_a_login_with_no_page_to_go_back_to_lands_on_the_dashboards(client, cluster, carol):
    """Not on Django's /accounts/profile/, which the portal does not have; the portal's own
    address leads there too, not to the admin's login page (which refuses a lead who is no
    staff)."""
    assert client.get("/").url == "/dash/"
    response = client.post("/dash/login/", {"username": "carol", "password": "pw-carol-1234"})
    assert response.status_code == 302 and response.url == "/dash/"


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/dash/queue/", "/dash/shares/research/"])
def test_members_and_outsiders_see_no_dashboard(client, cluster, bob, oscar, url):
    """bob is a member (not a lead) of ml-research; oscar belongs to no team. Their page says
    why, and where they can go instead (their jobs first); their header links to no page they
    may not see. (The cluster page sends them to their jobs: test_job_pages.)"""
    for user in (bob, oscar):
        client.force_login(user)
        response = client.get(url)
        assert response.status_code == 403
        page = response.content.decode()
        assert NOT_A_LEAD in page and 'href="/dash/notifications/"' in page
        assert 'href="/dash/jobs/"' in page
        assert 'href="/api/docs/"' in page
        assert 'href="/dash/queue/"' not in page and ">Cluster<" not in page


@pytest.mark.django_db
def test_a_lead_sees_their_team_and_shares_but_not_another_teams(client, cluster, carol):
    client.force_login(carol)
    assert 'href="/dash/queue/"' in client.get("/dash/").content.decode()
    assert client.get("/dash/").status_code == 200
    assert client.get("/dash/queue/").status_code == 200
    assert client.get("/dash/shares/vision/").status_code == 200
    assert client.get("/dash/teams/vision/").status_code == 200
    assert client.get("/dash/shares/research/").status_code == 404
    assert client.get("/dash/teams/ml-research/").status_code == 404


@pytest.mark.django_db
def test_an_admin_sees_every_page(client, cluster, root):
    client.force_login(root)
    history_sample()
    for url in ("/dash/?range=1h", "/dash/?range=30d", "/dash/shares/research/?range=7d",
                "/dash/teams/ml-research/", "/dash/teams/vision/", "/dash/queue/"):  # fmt: skip
        assert client.get(url).status_code == 200, url


@pytest.mark.django_db
def test_the_admin_links_to_the_dashboards(client, cluster, root, vision_share):
    client.force_login(root)
    assert b'href="/dash/"' in client.get("/admin/").content
    change = client.get(f"/admin/shares/quotashare/{vision_share.pk}/change/")
    assert b'href="/dash/shares/vision/"' in change.content


# --- Ranges and resolution ------------------------------------------------------------------


def test_each_range_reads_the_resolution_that_fits_it():
    now = T0
    assert resolution_for(time_range_from({"range": "1h"}, now), now) == Resolution.RAW
    assert resolution_for(time_range_from({"range": "24h"}, now), now) == Resolution.MINUTE
    assert resolution_for(time_range_from({"range": "7d"}, now), now) == Resolution.HOUR
    assert resolution_for(time_range_from({"range": "30d"}, now), now) == Resolution.HOUR
    # A short range 5 days ago: raw samples are pruned after 2 days, minutes are kept.
    old = TimeRange("custom", now - timedelta(days=5), now - timedelta(days=5, hours=-1))
    assert resolution_for(old, now) == Resolution.MINUTE


def test_a_custom_range_is_read_as_utc_and_a_bad_one_falls_back_with_a_message():
    custom = time_range_from(
        {"range": "custom", "start": "2026-03-01T08:00", "end": "2026-03-01T12:30"}, T0
    )
    assert (custom.start, custom.end) == (T0 - timedelta(hours=26), T0 - timedelta(hours=21.5))
    bad = time_range_from({"range": "custom", "start": "yesterday", "end": ""}, T0)
    assert bad.key == "24h" and bad.error


@pytest.mark.django_db
def test_a_long_range_stitches_hours_then_minutes_then_raw_samples_up_to_now(settings):
    """Hour 10:00 is rolled up, minutes 11:00–11:29 too; after that only raw samples exist."""
    settings.HISTORY_SAMPLE_SECONDS = 15
    UsageSample.objects.bulk_create(
        [row("vision", T0, Resolution.HOUR, own=4)]
        + [row("vision", T0 + timedelta(minutes=60 + m), own=2) for m in range(30)]
        + [
            row("vision", T0 + timedelta(minutes=90, seconds=s), Resolution.RAW, own=4)
            for s in (0, 15)
        ]  # fmt: skip
    )
    points = usage_history(start=T0, end=T0 + timedelta(hours=2), resolution=Resolution.HOUR)
    # Shown in hour buckets: 11:00 merges 30 minutes at 2 GPUs and 30 s at 4.
    assert [(p.at, p.seconds) for p in points] == [(T0, 3600), (T0 + timedelta(hours=1), 1830)]
    assert points[1].own == pytest.approx((2 * 1800 + 4 * 30) / 1830)
    hours = sum(p.own * p.seconds for p in points) / 3600
    assert hours == pytest.approx(4 + 1 + 4 * 30 / 3600)
    # A one-hour range read per minute shows each minute; the raw samples after them fall into
    # one more minute.
    minutes = usage_history(
        start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2), resolution=Resolution.MINUTE
    )
    assert [p.seconds for p in minutes] == [60] * 30 + [30]


@pytest.mark.django_db
def test_gpu_hours_add_up_use_borrowing_and_lending():
    UsageSample.objects.bulk_create(
        [row("research", T0 + timedelta(minutes=m), own=8, borrowed=4) for m in range(30)]
        + [row("vision", T0 + timedelta(minutes=m), own=2, lent=4) for m in range(30)]
    )
    hours = gpu_hours(shares=["research", "vision"], start=T0, end=T0 + timedelta(hours=1))
    assert (hours["research"].used, hours["research"].borrowed) == (6.0, 2.0)
    assert (hours["vision"].used, hours["vision"].lent) == (1.0, 2.0)


# --- Lending flows --------------------------------------------------------------------------


@pytest.mark.django_db
def test_borrowing_is_split_among_lenders_in_proportion_to_each_borrowers_part():
    """For an hour: research borrows 9 and y borrows 3 (12 in all); vision lends 4 and x lends
    2, so 6 came from the free pool. research's part is 9/12: it borrowed 3 GPU-hours from
    vision, 1.5 from x, 4.5 from the pool; y got the other quarter of vision's 4."""
    rows = []
    for m in range(60):
        at = T0 + timedelta(minutes=m)
        rows += [
            row("research", at, own=8, borrowed=9),
            row("y", at, own=8, borrowed=3),
            row("vision", at, lent=4),
            row("x", at, lent=2),
        ]
    UsageSample.objects.bulk_create(rows)
    window = {"start": T0, "end": T0 + timedelta(hours=1), "resolution": Resolution.MINUTE}
    research = lending_flows(shares=["research"], **window)
    assert research.borrowed_from == {"vision": 3.0, "x": 1.5, FREE_POOL: 4.5}
    assert research.lent_to == {}
    vision = lending_flows(shares=["vision"], **window)
    assert vision.lent_to == {"research": 3.0, "y": 1.0}
    assert vision.borrowed_from == {}


# --- Queue ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_queue_lists_jobs_within_their_limit_first_then_borrowers(
    client, cluster, vision_share, research_share, alice, carol, root
):
    """research runs 6 of its 8 (on n0): its 2-GPU job fits within the limit, its 4- and 8-GPU
    jobs would borrow. vision's 4-GPU job fits. Each pass: priority, then submission."""
    place(job(research_share, alice, 6), Node.objects.get(name="n0"), list(range(6)))
    borrow_4 = job(research_share, alice, 4, name="borrow-4", reason="no lendable h100 idle")
    within_2 = job(research_share, alice, 2, name="within-2")
    urgent_8 = job(research_share, alice, 8, priority=5, name="urgent-8")
    vision_4 = job(vision_share, carol, 4, name="vision-4")
    entries = queue_front()
    assert [e.job_id for e in entries] == [within_2.pk, vision_4.pk, urgent_8.pk, borrow_4.pk]
    assert [e.within_limit for e in entries] == [True, True, False, False]

    client.force_login(root)
    page = client.get("/dash/queue/").content.decode()
    assert page.index("within-2") < page.index("vision-4") < page.index("urgent-8")
    assert "no lendable h100 idle" in page


# --- Share page -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_share_page_shows_preemptions_with_who_reclaimed_and_jobs_with_reasons(
    client, cluster, vision_share, research_share, alice, carol
):
    borrower = job(research_share, alice, 8, name="big-borrower", reason="reclaimed by vision")
    owner = job(vision_share, carol, 8, state=Job.State.RUNNING, name="vision-train")
    JobAttempt.objects.create(
        job=borrower, number=1, outcome=JobAttempt.Outcome.PREEMPTED,
        ended_at=timezone.now() - timedelta(minutes=5), preempted_for=owner,
    )  # fmt: skip
    history_sample()
    client.force_login(alice)
    page = client.get("/dash/shares/research/?range=1h").content.decode()
    assert "big-borrower (research, 8 h100) reclaimed by vision-train of share vision" in page
    assert "reclaimed by vision" in page  # the job's reason in the jobs table
    for trace in ("own use (within limit)", "borrowed (above limit)", "lent to others", "limit",
                  "runnable demand", "preempted (its jobs)", "share changed"):  # fmt: skip
        assert f'"name":"{trace}"' in page
    client.force_login(carol)
    vision_page = client.get("/dash/shares/vision/?range=1h").content.decode()
    assert '"name":"reclaimed (for its jobs)"' in vision_page
    assert "big-borrower" in vision_page


@pytest.mark.django_db
def test_the_overview_stacks_every_share_and_links_only_to_visible_ones(client, cluster, carol):
    history_sample()
    client.force_login(carol)
    page = client.get("/dash/?range=1h").content.decode()
    assert '"name":"vision"' in page and '"name":"research"' in page
    assert 'href="/dash/shares/vision/' in page
    assert 'href="/dash/shares/research/' not in page
    assert "/static/vendor/plotly.min.js" in page and "cdn" not in page.lower()


def test_every_figure_is_built_as_a_figure_plotly_accepts():
    """Figures are plain dicts (graph objects were too slow); plotly's graph objects still
    accept each one, so no property is misspelt or misplaced."""
    import plotly.graph_objects as go

    from dashboards import figures
    from dashboards.selectors import (
        ClusterPoint,
        GpuTypeNow,
        LendingFlows,
        PreemptionEvent,
        ShareTotalPoint,
        UsagePoint,
    )

    at = [T0 + timedelta(minutes=10 * i) for i in range(3)]
    totals = [ShareTotalPoint(t, 600, s, "h100", 3.0) for t in at for s in ("research", "vision")]
    cluster = [ClusterPoint(t, 600, "h100", 16, 6, 0, 7) for t in at]
    usage = [UsagePoint(t, 600, "research", "h100", 8, 6, 2, 0, 2, 1, 8) for t in at]
    preempted = PreemptionEvent(at[1], 1, "#1 sweep", "research", "h100", 4, "reclaim", 2,
                                "#2 detector", "vision")  # fmt: skip
    change = {"at": at[2], "by": "root", "fields": ["weight: 1.0 → 2.0"]}
    built = [
        figures.capacity_now([GpuTypeNow("h100", 16, 6, 0, 10.0)]),
        figures.stacked_usage("h100", totals, cluster, "last hour"),
        figures.share_usage("research", "h100", usage, [preempted], [change], "last hour"),
        figures.lending_bars("Vision", LendingFlows({"research": 1.5}, {FREE_POOL: 2.0}), "1 h"),
        figures.wait_histogram("Vision", {"vision": [1.0, 4.0]}, "last hour"),
    ]
    for fig in built:
        go.Figure(fig)  # raises ValueError on any property plotly does not know
    stacked = built[1]["data"]
    assert [t["name"] for t in stacked] == ["research", "vision", "capacity"]
    # Three steps, and the end of the newest one.
    assert stacked[0]["y"] == [3.0, 3.0, 3.0, 3.0]
    assert stacked[0]["line"]["color"] == figures.share_colour("research")
