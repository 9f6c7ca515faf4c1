"""Dashboard pages and /metrics. Thin: selectors read, figures draw."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required as _login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboards import docs, figures, selectors, tokens
from dashboards.forms import EstimateForm
from dashboards.metrics import metrics_allowed, metrics_text
from scheduler.jobs.selectors import (
    CANCEL_REFUSED,
    PRIORITY_REFUSED,
    may_cancel,
    may_change_priority,
)
from scheduler.jobs.services import ShareNotVisible, job_cancel, job_estimate, job_set_priority
from scheduler.models import PRIORITY_RANGE, Job, priority_in_range
from shares.selectors import current_usage, shares_visible_to

NOT_A_LEAD = "The dashboards are for team leads and admins."
NO_SUCH_JOB = "No job {job} among the jobs you may see."
SHARE_NOT_YOURS = "share {name!r} is not a share of your teams."
UNKNOWN_STATE = "state: {value!r} is not a job state; showing jobs in every state."
METRICS_FORBIDDEN = (
    "metrics: send Authorization: Bearer <METRICS_TOKEN>, or scrape from an address in "
    "METRICS_ALLOWED_NETS.\n"
)
# Team leads need not be staff, so they log in here rather than on the admin's login page.
login_required = _login_required(login_url=reverse_lazy("dashboards:login"))
RANGE_LABELS = {"1h": "last hour", "24h": "last 24 h", "7d": "last 7 days", "30d": "last 30 days"}


def _not_for_this_user(request: HttpRequest) -> HttpResponse | None:
    """A 403 page for a signed-in member or outsider (the dashboards are for team leads and
    admins) that says so and where they can go instead; None for a lead or an admin."""
    if selectors.can_view_dashboards(request.user):
        return None
    return render(request, "dashboards/not_a_lead.html",
                  {**_nav(request), "message": NOT_A_LEAD}, status=403)  # fmt: skip


def _range_context(request: HttpRequest):
    now = timezone.now()
    time_range = selectors.time_range_from(request.GET, now)
    resolution = selectors.resolution_for(time_range, now)
    label = RANGE_LABELS.get(time_range.key) or (
        f"{time_range.start:%Y-%m-%d %H:%M} – {time_range.end:%Y-%m-%d %H:%M} UTC"
    )
    return (
        now,
        time_range,
        resolution,
        {
            "range": time_range,
            "range_label": label,
            "range_keys": list(selectors.RANGES),
            "resolution": resolution.label,
        },
    )


def _nav(request: HttpRequest) -> dict:
    return selectors.navigation(request.user)


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    """Cluster overview: capacity against use now, use over time by share, idle lendable GPUs,
    the nodes that hold GPUs back, the queue."""
    if not selectors.can_view_dashboards(request.user):
        return redirect("dashboards:jobs")  # a member's own jobs are what they come for
    now, time_range, resolution, context = _range_context(request)
    usage = current_usage()
    gpu_now = selectors.cluster_now(usage)
    window = {"start": time_range.start, "end": time_range.end, "resolution": resolution,
              "max_points": selectors.OVERVIEW_MAX_POINTS}  # fmt: skip
    points = selectors.usage_totals_history(**window)
    cluster = selectors.cluster_history(**window)  # the capacity line on the same buckets
    by_type, cluster_by_type = defaultdict(list), defaultdict(list)
    for p in points:
        by_type[p.gpu_type].append(p)
    for c in cluster:
        cluster_by_type[c.gpu_type].append(c)
    types = sorted(set(by_type) | {row.gpu_type for row in gpu_now})
    charts = [figures.to_html(figures.capacity_now(gpu_now), "fig-capacity-now")]
    for gpu_type in types:
        fig = figures.stacked_usage(
            gpu_type, by_type[gpu_type], cluster_by_type[gpu_type], context["range_label"]
        )
        charts.append(figures.to_html(fig, f"fig-usage-{gpu_type}"))
    context.update(
        _nav(request),
        charts=charts,
        gpu_now=gpu_now,
        nodes_holding_back=selectors.nodes_holding_back(),
        queue=selectors.queue_summary(now),
        shares=sorted({row.share for row in usage}),
        visible_shares=set(selectors.visible_shares(request.user).values_list("name", flat=True)),
    )
    return render(request, "dashboards/overview.html", context)


@login_required
@require_GET
def share_detail(request: HttpRequest, name: str) -> HttpResponse:
    """One share: own use against its limit, lent, borrowed, demand, preemptions, changes, jobs."""
    if refused := _not_for_this_user(request):
        return refused
    share = selectors.visible_shares(request.user).filter(name=name).first()
    if share is None:
        raise Http404(f"No share {name!r} among the shares you may see.")
    _now, time_range, resolution, context = _range_context(request)
    points = selectors.usage_history(start=time_range.start, end=time_range.end,
                                     resolution=resolution, shares=[share.name])  # fmt: skip
    preemptions = selectors.preemption_events(start=time_range.start, end=time_range.end,
                                              share=share)  # fmt: skip
    changes = selectors.share_change_events(share=share, start=time_range.start,
                                            end=time_range.end)  # fmt: skip
    by_type = defaultdict(list)
    for p in points:
        by_type[p.gpu_type].append(p)
    types = sorted(set(share.limits) | set(by_type))
    charts = [
        figures.to_html(
            figures.share_usage(
                share.name, t, by_type[t], preemptions, changes, context["range_label"]
            ),
            f"fig-share-{t}",
        )  # fmt: skip
        for t in types
    ]
    now_rows = [row for row in current_usage() if row.share == share.name]
    context.update(
        _nav(request),
        share=share,
        colour=figures.share_colour(share.name),
        charts=charts,
        now_rows=now_rows,
        preemptions=preemptions[-50:][::-1],
        changes=changes[-20:][::-1],
        jobs=selectors.share_jobs(share),
    )
    return render(request, "dashboards/share.html", context)


@login_required
@require_GET
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """A team lead's page: their shares, who borrows from them and from whom they borrow,
    wait times, GPU-hours this week and month."""
    if refused := _not_for_this_user(request):
        return refused
    team = selectors.visible_teams(request.user).filter(slug=slug).first()
    if team is None:
        raise Http404(f"No team {slug!r} among the teams you may see.")
    now, time_range, resolution, context = _range_context(request)
    shares = list(team.shares.prefetch_related("capacity_limits").order_by("name"))
    names = [s.name for s in shares]
    flows = selectors.lending_flows(shares=names, start=time_range.start, end=time_range.end,
                                    resolution=resolution)  # fmt: skip
    waits = selectors.wait_times(shares=names, start=time_range.start, end=time_range.end)
    week_start = (now - timedelta(days=now.weekday())).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    week = selectors.gpu_hours(shares=names, start=week_start, end=now)
    month = selectors.gpu_hours(shares=names, start=month_start, end=now)
    wait_stats = {}
    for share, values in waits.items():
        ordered = sorted(values)
        wait_stats[share] = {
            "jobs": len(ordered),
            "median": ordered[len(ordered) // 2],
            "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))],
        }
    context.update(
        _nav(request),
        team=team,
        shares=[(s, figures.share_colour(s.name)) for s in shares],
        charts=[
            figures.to_html(
                figures.lending_bars(team.name, flows, context["range_label"]), "fig-lending"
            ),
            figures.to_html(
                figures.wait_histogram(team.name, waits, context["range_label"]), "fig-waits"
            ),
        ],  # fmt: skip
        flows=flows,
        wait_stats=wait_stats,
        hours=[(s.name, week[s.name], month[s.name]) for s in shares],
        week_start=week_start,
        month_start=month_start,
        now_rows=[row for row in current_usage() if row.share in names],
    )
    return render(request, "dashboards/team.html", context)


QUEUE_CHART_HOURS = 12  # how far ahead the queue page's charts look


@login_required
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    """The front of the queue, in the order the engine considers it, with each job's reason."""
    if refused := _not_for_this_user(request):
        return refused
    now = timezone.now()
    context = _nav(request)
    entries = selectors.queue_front(now=now)
    gpu_types = sorted({entry.gpu_type for entry in entries if entry.estimated_start})
    charts = [
        figures.to_html(
            figures.queue_gantt(gpu_type, entries, now, QUEUE_CHART_HOURS), f"fig-queue-{gpu_type}"
        )
        for gpu_type in gpu_types
    ]
    context.update(
        entries=entries,
        charts=charts,
        queue=selectors.queue_summary(now),
        borrow_order=settings.BORROW_ORDER,
        visible_shares=set(selectors.visible_shares(request.user).values_list("name", flat=True)),
    )
    return render(request, "dashboards/queue.html", context)


@login_required
@require_GET
def jobs(request: HttpRequest) -> HttpResponse:
    """Everyone's jobs page: the jobs they submitted (`?whose=mine`, the default) or every job of
    their teams' shares (`whose=teams`; every job for an admin), newest first, in one state
    (`state=`) or all, 50 a page."""
    mine = request.GET.get("whose") != "teams"
    state = request.GET.get("state") or None
    error = None
    if state is not None and state not in Job.State.values:
        error, state = UNKNOWN_STATE.format(value=state), None
    page = Paginator(selectors.jobs_of(request.user, mine=mine, state=state),
                     selectors.JOBS_PER_PAGE).get_page(request.GET.get("page"))  # fmt: skip
    selectors.mark_held_off(page.object_list)
    shown = selectors.jobs_shown(page.object_list, page.paginator.count)
    if request.GET.get("look"):  # the page following its jobs (static/dashboards/follow.js)
        return JsonResponse({"shown": shown})
    context = {
        **_nav(request),
        "page": page,
        "mine": mine,
        "state": state,
        "states": Job.State.values,
        "error": error,
        "shown": shown,
        "follow_every": settings.JOB_PAGE_FOLLOW_SECONDS,
    }
    return render(request, "dashboards/jobs.html", context)


@login_required
@require_GET
def job_estimate_view(request: HttpRequest) -> HttpResponse:
    """What-if before submitting: when a job of this shape would start if it were submitted now,
    behind the queue as it is, and why it would wait (the API's `POST jobs/estimate/`)."""
    shares = list(shares_visible_to(request.user).order_by("name"))
    answer = None
    if "share" in request.GET:
        form = EstimateForm(request.GET, shares=shares)
        if form.is_valid():
            data = dict(form.cleaned_data)
            share_name = data.pop("share")
            try:
                answer = job_estimate(
                    user=request.user, share_name=share_name,
                    members_only=True, **data,
                )  # fmt: skip
            except ShareNotVisible:
                form.add_error("share", SHARE_NOT_YOURS.format(name=share_name))
            except ValidationError as error:
                by_field = error.message_dict if hasattr(error, "error_dict") else {None: error}
                for field, messages in by_field.items():
                    form.add_error(field if field in form.fields else None, messages)
    else:
        form = EstimateForm(shares=shares)
    context = {**_nav(request), "form": form, "answer": answer, "has_shares": bool(shares)}
    return render(request, "dashboards/estimate.html", context)


@login_required
@require_GET
def job_view(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job as its submitter follows it: state and reason, estimated start, who is ahead,
    its attempts (nodes, GPUs, outcome, the end of the log) and every state change with its
    reason; a cancel button for whoever may cancel it."""
    page = selectors.job_page(request.user, job_id)
    if page is None:
        raise Http404(NO_SUCH_JOB.format(job=job_id))
    context = {**_nav(request), "page": page, "follow_every": settings.JOB_PAGE_FOLLOW_SECONDS}
    return render(request, "dashboards/job.html", context)


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    """Cancel from the job's page (the rule and its effects are the API's: `job_cancel`)."""
    job = _visible_job(request, job_id)
    if not may_cancel(request.user, job):
        return _job_refused(request, job_id, CANCEL_REFUSED.format(team=job.share.team.slug), 403)
    job_cancel(job=job, user=request.user)
    return redirect("dashboards:job", job_id=job_id)


@login_required
@require_POST
def job_priority_view(request: HttpRequest, job_id: int) -> HttpResponse:
    """Change a job's priority from its page (a lead's or an admin's call, as in the API)."""
    job = _visible_job(request, job_id)
    if not may_change_priority(request.user, job):
        error = PRIORITY_REFUSED.format(team=job.share.team.slug)
        return _job_refused(request, job_id, error, 403)
    try:
        priority = int(request.POST.get("priority", ""))
    except ValueError:
        priority = None
    if priority is None or not priority_in_range(priority):
        return _job_refused(request, job_id, PRIORITY_RANGE, 400)
    try:
        job_set_priority(job=job, priority=priority)
    except ValidationError as error:  # it ended meanwhile
        return _job_refused(request, job_id, " ".join(error.messages), 400)
    return redirect("dashboards:job", job_id=job_id)


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    job = selectors.visible_job(request.user, job_id)
    if job is None:
        raise Http404(NO_SUCH_JOB.format(job=job_id))
    return job


def _job_refused(request: HttpRequest, job_id: int, error: str, status: int) -> HttpResponse:
    """The job's page again, saying why what was asked was not done."""
    page = selectors.job_page(request.user, job_id)
    if page is None:  # gone from the user's sight meanwhile
        raise Http404(NO_SUCH_JOB.format(job=job_id))
    return render(request, "dashboards/job.html",
                  {**_nav(request), "page": page, "error": error}, status=status)  # fmt: skip


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """Everyone's own API token: whether they have one, and a new one on POST (the old one
    stops working), its key shown on that answer only."""
    made = tokens.api_token_replace(user=request.user) if request.method == "POST" else None
    context = {
        **_nav(request),
        "token": made or tokens.api_token_of(user=request.user),
        "made": made,
        "portal_url": request.build_absolute_uri("/").rstrip("/"),
    }
    return render(request, "dashboards/api_token.html", context)


@require_GET
def docs_index(request: HttpRequest) -> HttpResponse:
    """The project's documents, by title. Open to everyone, as the API's documentation is:
    they describe the portal and hold no data."""
    context = {**_doc_nav(request), "docs": docs.doc_titles()}
    return render(request, "dashboards/docs.html", context)


@require_GET
def doc_page(request: HttpRequest, name: str) -> HttpResponse:
    """One document of docs/, rendered (dashboards.docs)."""
    found = docs.doc(name)
    if found is None:
        raise Http404(f"No document {name!r}: see /docs/ for those there are.")
    return render(request, "dashboards/doc.html", {**_doc_nav(request), "doc": found})


def _doc_nav(request: HttpRequest) -> dict:
    return _nav(request) if request.user.is_authenticated else {}


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics (text format 0.0.4); see docs/dashboards.md for access."""
    # generate_latest writes text format 0.0.4, which every Prometheus version reads.
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

    if not metrics_allowed(request):
        return HttpResponse(METRICS_FORBIDDEN, status=403, content_type="text/plain")
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_PLAIN_0_0_4)
