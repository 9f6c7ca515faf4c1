"""The dashboards in a real browser: Playwright drives Debian's Chromium (/usr/bin/chromium,
installed by scripts/install_browser.sh) against the live server. Screenshots are left under
test-artifacts/screenshots/."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone

from dashboards.services import history_rollup, history_sample
from scheduler.agent.protocol import END_EXIT
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.nodes.attempts import attempt_exited
from shares.models import QuotaShare, ShareChange
from shares.services import share_create, share_update
from tests.conftest import make_node, start_latest_attempt

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
PLOT = ".js-plotly-plot .main-svg"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def scenario(settings, vision_share, research_share, vision_team, carol, alice, root):
    """An hour of history, sampled every minute: research runs 8 h100 of its own, borrows 4
    of vision's idle GPUs from minute 20, and loses them when vision reclaims at minute 40.
    vision's RESERVE share inference runs 2, then 4 l4."""
    settings.HISTORY_SAMPLE_SECONDS = 60  # one sample a minute, each standing for that minute
    # research is an h100 share here: the l4 charts show inference alone.
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    inference = share_create(
        name="inference", team=vision_team, capacity_limits={"l4": 4},
        strategy=QuotaShare.Strategy.RESERVE, source=ShareChange.Source.COMMAND,
    )  # fmt: skip
    for name, gpu_type in (("h0", "h100"), ("h1", "h100"), ("l0", "l4")):
        Node.objects.create(name=name, gpu_type=gpu_type, gpus=8 if gpu_type == "h100" else 4)

    def job(share, user, gpus, gpu_type="h100", **fields):
        return Job.objects.create(
            share=share, submitted_by=user, gpu_type=gpu_type, gpus=gpus, command="train",
            **fields,
        )  # fmt: skip

    def hold(job, node: str) -> None:
        """The job holds GPUs 0.. of `node`, as the cycle records a placement (an attempt with
        its GPUs), for the pages that read the cycle's snapshot (the queue)."""
        attempt = JobAttempt.objects.create(
            job=job, number=job.attempt_count + 1,
            allocations=[{"node": node, "gpu_indices": list(range(job.gpus))}],
        )  # fmt: skip
        GpuAssignment.objects.bulk_create(
            GpuAssignment(attempt=attempt, node=Node.objects.get(name=node), gpu_index=index)
            for index in range(job.gpus)
        )
        Job.objects.filter(pk=job.pk).update(attempt_count=attempt.number)

    now = timezone.now()
    start = now - timedelta(minutes=60)
    own = job(research_share, alice, 8, name="research-pretrain", state=Job.State.RUNNING)
    extra = job(research_share, alice, 4, name="research-sweep", state=Job.State.RUNNABLE)
    lender = job(vision_share, carol, 8, name="vision-detector", state=Job.State.RUNNABLE,
                 priority=10)  # fmt: skip
    serve = job(inference, carol, 2, gpu_type="l4", name="serve", state=Job.State.RUNNING)
    hold(own, "h0")
    hold(serve, "l0")
    job(research_share, alice, 8, name="research-eval", state=Job.State.RUNNABLE,
        reason="no lendable h100 idle")  # fmt: skip
    for minute in range(61):
        if minute == 20:
            Job.objects.filter(pk=extra.pk).update(
                state=Job.State.RUNNING, started_at=start + timedelta(minutes=20)
            )
        if minute == 30:
            Job.objects.filter(pk=serve.pk).update(gpus=4)
        if minute == 40:
            Job.objects.filter(pk=extra.pk).update(
                state=Job.State.RUNNABLE, reason="preempted: reclaimed by vision"
            )
            Job.objects.filter(pk=lender.pk).update(
                state=Job.State.RUNNING, started_at=start + timedelta(minutes=40)
            )
            hold(lender, "h1")
            JobAttempt.objects.create(
                job=extra, number=1, outcome=JobAttempt.Outcome.PREEMPTED,
                ended_at=start + timedelta(minutes=40), preempted_for=lender,
            )  # fmt: skip
        history_sample(start + timedelta(minutes=minute))
    history_rollup(now)
    # Waits before first start, for the team page's histogram: jobs were submitted at `start`.
    Job.objects.filter(pk=own.pk).update(started_at=start + timedelta(minutes=1))
    Job.objects.filter(pk__in=[own.pk, extra.pk, lender.pk, serve.pk]).update(submitted_at=start)
    Job.objects.filter(pk=serve.pk).update(started_at=start + timedelta(minutes=3))
    return {"carol": ("carol", "pw-carol-1234"), "root": ("root", "pw-root-1234")}


@pytest.fixture
def browser_page(monkeypatch):
    if not CHROMIUM.exists():
        pytest.skip(
            "Chromium is not installed at /usr/bin/chromium and could not be: run "
            "scripts/install_browser.sh as root (scripts/test.sh does)."
        )
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls that pytest-django
    # makes on teardown are still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield page
        # While Playwright's loop runs, this thread's ORM calls (the scenario's) get database
        # connections of their own, which nothing else closes: one left open kept the test
        # database from being dropped at the end of the run.
        connections.close_all()
        browser.close()


def log_in(page, live_server, username: str, password: str, next_url: str = "/dash/") -> None:
    page.goto(f"{live_server.url}/dash/login/?next={next_url}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}{next_url}")


def trace_names(page, div_id: str) -> list[str]:
    page.wait_for_selector(f"#{div_id}.js-plotly-plot .main-svg")
    return page.evaluate(f"document.getElementById('{div_id}').data.map(t => t.name)")


def open_and_shoot(page, url: str, name: str) -> None:
    response = page.goto(url)
    assert response.status == 200, url
    page.wait_for_selector(PLOT)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_a_lead_sees_the_cluster_their_share_and_team_but_not_another_team(
    live_server, browser_page, scenario
):
    page = browser_page
    log_in(page, live_server, *scenario["carol"])
    base = live_server.url

    open_and_shoot(page, f"{base}/dash/?range=1h", "lead-overview")
    assert trace_names(page, "fig-usage-h100") == ["research", "vision", "capacity"]
    assert trace_names(page, "fig-usage-l4") == ["inference", "capacity"]
    assert trace_names(page, "fig-capacity-now") == [
        "capacity (nodes up)", "in use", "idle, lendable", "down",
    ]  # fmt: skip

    open_and_shoot(page, f"{base}/dash/shares/vision/?range=1h", "lead-share-vision")
    names = trace_names(page, "fig-share-h100")
    assert names[:5] == [
        "own use (within limit)", "lent to others", "borrowed (above limit)", "limit",
        "runnable demand",
    ]  # fmt: skip
    assert "reclaimed (for its jobs)" in names
    reclaims = page.evaluate(
        "document.getElementById('fig-share-h100').data"
        ".find(t => t.name === 'reclaimed (for its jobs)').x.length"
    )
    assert reclaims == 1

    open_and_shoot(page, f"{base}/dash/teams/vision/?range=1h", "lead-team-vision")
    assert trace_names(page, "fig-lending") == ["lent to (borrowers)", "borrowed from (lenders)"]
    assert trace_names(page, "fig-waits") == ["inference", "vision"]
    lent_to = page.evaluate("document.getElementById('fig-lending').data[0]")
    assert lent_to["y"] == ["lent to research"]
    assert lent_to["x"] == [pytest.approx(4 * 20 / 60, abs=0.01)]  # 4 GPUs for 20 minutes

    response = page.goto(f"{base}/dash/shares/research/")
    assert response.status == 404
    response = page.goto(f"{base}/dash/teams/ml-research/")
    assert response.status == 404


def test_an_admin_opens_every_page_from_the_admin(live_server, browser_page, scenario):
    page = browser_page
    log_in(page, live_server, *scenario["root"])
    base = live_server.url

    page.goto(f"{base}/admin/")
    page.click("text=Dashboards")
    page.wait_for_selector(PLOT)
    open_and_shoot(page, f"{base}/dash/?range=24h", "admin-overview-24h")
    assert trace_names(page, "fig-usage-h100") == ["research", "vision", "capacity"]

    open_and_shoot(page, f"{base}/dash/shares/research/?range=1h", "admin-share-research")
    names = trace_names(page, "fig-share-h100")
    assert "preempted (its jobs)" in names
    hover = page.evaluate(
        "document.getElementById('fig-share-h100').data"
        ".find(t => t.name === 'preempted (its jobs)').text"
    )
    assert hover == [
        "research-sweep (research, 4 h100) reclaimed by vision-detector of share vision"
    ]

    open_and_shoot(page, f"{base}/dash/teams/ml-research/?range=1h", "admin-team-research")
    borrowed_from = page.evaluate("document.getElementById('fig-lending').data[1].y")
    assert borrowed_from == ["borrowed from vision"]

    response = page.goto(f"{base}/dash/queue/")
    assert response.status == 200
    rows = page.locator("table.queue tr").all_inner_texts()
    assert "research-sweep" in rows[1] and "borrower" in rows[1]
    assert "research-eval" in rows[2] and "no lendable h100 idle" in rows[2]
    page.screenshot(path=str(SCREENSHOTS / "admin-queue.png"), full_page=True)


@pytest.fixture
def young_system(settings, vision_share, research_share, root, alice):
    """A portal six minutes old, sampled every 15 s and rolled up every minute, as beat does:
    research runs 8 h100 of its own, and from its fourth minute borrows 4 more."""
    settings.HISTORY_SAMPLE_SECONDS = 15
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    for name in ("h0", "h1"):
        Node.objects.create(name=name, gpu_type="h100", gpus=8)

    def job(gpus: int) -> None:
        Job.objects.create(share=research_share, submitted_by=alice, gpu_type="h100", gpus=gpus,
                           command="train", state=Job.State.RUNNING)  # fmt: skip

    job(8)
    now = timezone.now()
    samples = [now - timedelta(minutes=6) + timedelta(seconds=15 * n) for n in range(24)]
    for n, at in enumerate(samples):
        if n == 12:
            job(4)
        history_sample(at)
        history_rollup(at)
    return {"first": samples[0], "last": samples[-1], "root": ("root", "pw-root-1234")}


# An SVG path of horizontal and vertical segments only.
STEP_PATH = re.compile(r"M[-\d.]+,[-\d.]+([HV][-\d.]+)*")
# What plotly drew of each of a chart's traces over time: the x values it was given (UTC times
# of samples) and the x it plotted (milliseconds), its line shape and y values, and the path of
# its line on screen.
PLOTTED = """id => {
    const gd = document.getElementById(id);
    const paths = {};
    for (const group of gd.querySelectorAll(".scatterlayer .trace")) {
        const index = group.__data__[0].trace.index;
        paths[index] = Array.from(group.querySelectorAll("path.js-line"), p => p.getAttribute("d"));
    }
    return gd._fullData.filter(t => t.mode === "lines").map(t => ({
        name: t.name, shape: t.line.shape, x: gd.data[t.index].x, y: gd.data[t.index].y,
        plotted_x: gd.calcdata[t.index].map(point => point.x), paths: paths[t.index] || [],
    }));
}"""


def test_a_young_systems_charts_start_at_its_first_sample_and_hold_each_step(
    live_server, browser_page, young_system
):
    """On a portal six minutes old, the 24 h charts draw from the first sample on, nothing
    before it, and each value as a step that holds until the next (the newest until the last
    sample)."""
    page = browser_page
    log_in(page, live_server, *young_system["root"])
    first, last = young_system["first"], young_system["last"]
    first_ms = (first - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1)

    for url, div, names in (
        ("/dash/?range=24h", "fig-usage-h100", ["research", "vision", "capacity"]),
        ("/dash/shares/research/?range=24h", "fig-share-h100", [
            "own use (within limit)", "lent to others", "borrowed (above limit)", "limit",
            "runnable demand",
        ]),
    ):  # fmt: skip
        open_and_shoot(page, f"{live_server.url}{url}", f"young-{div}")
        page.wait_for_selector(f"#{div}.js-plotly-plot .main-svg")
        traces = page.evaluate(PLOTTED, div)
        assert [t["name"] for t in traces] == names
        for trace in traces:
            name = trace["name"]
            given = [datetime.fromisoformat(x).replace(tzinfo=UTC) for x in trace["x"]]
            assert (given[0], given[-1]) == (first, last), name
            assert given == sorted(given), name
            assert min(x for x in trace["plotted_x"] if x is not None) >= int(first_ms), name
            assert trace["shape"] == "hv", name
            assert trace["y"][-1] == trace["y"][-2], name  # the newest step holds its value
            # On screen the line goes only across and up or down: steps, no slopes.
            assert trace["paths"] and all(STEP_PATH.fullmatch(d) for d in trace["paths"]), name


def test_the_queue_page_draws_the_next_hours_of_each_gpu_type(live_server, browser_page, scenario):
    """With estimates stored on the waiting h100 jobs, the queue page draws a bar for the job
    that starts within the chart's hours, from its estimated start for its expected run time;
    the job estimated a day later is left out."""
    now = timezone.now()
    soon, later = Job.objects.filter(state=Job.State.RUNNABLE, gpu_type="h100").order_by("pk")
    for job, hours in ((soon, 1), (later, 30)):
        Job.objects.filter(pk=job.pk).update(
            estimated_start=now + timedelta(hours=hours), expected_seconds=1800,
            estimate_basis="simulated from the queue now, assuming no new job is submitted",
        )  # fmt: skip
    page = browser_page
    log_in(page, live_server, *scenario["root"])
    page.goto(f"{live_server.url}/dash/queue/")
    page.wait_for_selector(f"#fig-queue-h100{PLOT}")
    bars = page.evaluate("document.getElementById('fig-queue-h100').data[0]")
    assert len(bars["y"]) == 1 and f"job {soon.pk} (research, " in bars["y"][0]
    assert bars["x"] == [1_800_000]
    assert page.locator("#fig-queue-h100 .bars path").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "queue-chart.png"), full_page=True)


def test_a_member_follows_and_cancels_their_job_in_the_browser(
    live_server, browser_page, research_share, bob
):
    """bob, a member, signs in, lands on his jobs, opens his waiting job (its reason on the
    page), filters by state with the select (which submits itself), and cancels the job."""
    Node.objects.create(name="h0", gpu_type="h100", gpus=8)
    job = Job.objects.create(
        share=research_share, submitted_by=bob, gpu_type="h100", gpus=8, command="train",
        name="sweep", state=Job.State.RUNNABLE, reason="waiting for the next cycle",
    )  # fmt: skip
    page = browser_page
    page.goto(f"{live_server.url}/dash/login/")
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", "pw-bob-1234")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/dash/jobs/")
    page.select_option("select[name=state]", "RUNNABLE")
    page.wait_for_url(re.compile(r".*state=RUNNABLE.*"))
    page.click(f"a[href='/dash/jobs/{job.pk}/']")
    page.wait_for_url(f"{live_server.url}/dash/jobs/{job.pk}/")
    assert "waiting for the next cycle" in page.inner_text("#state")
    page.screenshot(path=str(SCREENSHOTS / "job.png"), full_page=True)
    page.click("#cancel button")
    page.wait_for_selector("#state >> text=CANCELLED")
    assert "cancelled by bob" in page.inner_text("#state")
    assert page.locator("#cancel").count() == 0


def test_a_job_page_follows_its_job_until_it_ends(
    live_server, browser_page, research_share, bob, settings
):
    """bob keeps his waiting job's page open: it shows the job placed, then running, then
    succeeded, each without his reloading it, and stops following once the job has ended."""
    settings.JOB_PAGE_FOLLOW_SECONDS = 0.3
    node = make_node("h0")
    job, _ = job_submit(user=bob, share_name="research", gpu_type="h100", gpus=8, command="x")
    page = browser_page
    log_in(page, live_server, "bob", "pw-bob-1234", f"/dash/jobs/{job.pk}/")
    assert page.inner_text("#state").startswith("RUNNABLE")
    assert "follows the job" in page.inner_text("#follow")
    # An estimate moved by seconds shows the same minute: no reload. Moved by an hour: reload.
    soon = timezone.now().replace(second=0, microsecond=0) + timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(estimated_start=soon, estimate_basis="b")
    page.wait_for_selector("#estimate >> text=Estimated start")
    page.evaluate("window.notReloaded = true")
    Job.objects.filter(pk=job.pk).update(estimated_start=soon + timedelta(seconds=20))
    page.wait_for_timeout(1500)  # five looks
    assert page.evaluate("window.notReloaded === true")
    Job.objects.filter(pk=job.pk).update(estimated_start=soon + timedelta(hours=1))
    page.wait_for_function("window.notReloaded === undefined")
    cycle_run(force=True)
    page.wait_for_selector("#state >> text=SCHEDULED")
    start_latest_attempt(job)
    page.wait_for_selector("#state >> text=RUNNING")
    attempt = JobAttempt.objects.get(job=job)
    attempt_exited(node=node, attempt_id=attempt.pk, end=END_EXIT, exit_code=0)
    page.wait_for_selector("#state >> text=SUCCEEDED")
    assert page.locator("#follow").count() == 0


def test_the_jobs_page_follows_its_jobs(live_server, browser_page, research_share, bob, settings):
    """bob's jobs page shows his job placed, and his next job when it comes, without his
    reloading it."""
    settings.JOB_PAGE_FOLLOW_SECONDS = 0.3
    make_node("h0")
    job, _ = job_submit(user=bob, share_name="research", gpu_type="h100", gpus=8, command="x")
    page = browser_page
    log_in(page, live_server, "bob", "pw-bob-1234", "/dash/jobs/")
    row = f"tr:has(a[href='/dash/jobs/{job.pk}/'])"
    assert "RUNNABLE" in page.inner_text(row)
    cycle_run(force=True)
    page.wait_for_selector(f"{row} >> text=SCHEDULED")
    second, _ = job_submit(user=bob, share_name="research", gpu_type="h100", gpus=4, command="y")
    page.wait_for_selector(f"a[href='/dash/jobs/{second.pk}/']")


def test_a_job_page_says_how_far_its_times_are_from_now(
    live_server, browser_page, research_share, bob
):
    """bob's waiting job: its page shows the estimated start and the submission in UTC, each
    with how far it is from now by the browser's clock; so does his jobs page."""
    make_node("h0")
    now = timezone.now()
    job, _ = job_submit(user=bob, share_name="research", gpu_type="h100", gpus=8, command="x")
    Job.objects.filter(pk=job.pk).update(
        submitted_at=now - timedelta(minutes=3),
        estimated_start=now + timedelta(minutes=20, seconds=10),
        estimated_allocations=[{"node": "h0", "gpu_indices": [0, 1, 2, 3, 4, 5, 6, 7]}],
        estimate_basis="b",
    )
    page = browser_page
    log_in(page, live_server, "bob", "pw-bob-1234", f"/dash/jobs/{job.pk}/")
    estimate = page.inner_text("#estimate")
    assert re.search(r"Estimated start: [-\d]+ [:\d]+ UTC \(in 20 min\) on h0", estimate)
    assert estimate.endswith("on h0 (GPUs 0,1,2,3,4,5,6,7). (b)")
    assert re.search(r"bob at [-\d]+ [:\d]+ UTC \(3 min ago\)", page.inner_text("table.job"))
    page.goto(f"{live_server.url}/dash/jobs/")
    assert "(in 20 min)" in page.inner_text(f"tr:has(a[href='/dash/jobs/{job.pk}/'])")
