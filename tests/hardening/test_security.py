"""Security checks: CSRF on every browser form and on session-authenticated API writes, admin-only
pages and endpoints, and secrets (the agent join token, node tokens, SECRET_KEY) that never show
up where they should not: API responses, server logs, pages.

(`manage.py check --deploy` with production settings is tested in tests/portal/test_setup.py.)"""

from __future__ import annotations

import logging
import re

import pytest
from django.conf import settings
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, JobAttempt
from tests.api.helpers import add_cluster, job_request
from tests.conftest import password_of

JOIN = "join-token-that-must-stay-secret-4242"


@pytest.fixture
def world(world):
    """The shared world on the API tests' cluster, with a known agent join token."""
    add_cluster(world)
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    return world


def csrf_client(user=None) -> Client:
    client = Client(enforce_csrf_checks=True)
    if user is not None:
        client.force_login(user)
    return client


def csrf_token(client: Client, path: str) -> str:
    """The token a browser would send: from the form the page renders."""
    page = client.get(path).content.decode()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


# --- CSRF on browser forms ----------------------------------------------------------------------


def admin_form_urls(world) -> list[str]:
    """Every admin form a browser posts: add, change (an existing row), delete, and the
    changelist (admin actions), for every registered model; plus logout and password change."""
    urls = [reverse("admin:logout"), reverse("admin:password_change")]
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
        urls.append(reverse("admin:{}_{}_add".format(*info)))
        obj = model_admin.get_queryset(_request(world)).first()
        if obj is not None:
            urls.append(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
            urls.append(reverse("admin:{}_{}_delete".format(*info), args=[obj.pk]))
    return urls


def _request(world):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = world.users["root"]
    return request


def test_admin_login_requires_csrf(world):
    """The login form without its CSRF token is refused; with it, the admin logs in."""
    client = csrf_client()
    response = client.post("/admin/login/", {"username": "root", "password": password_of("root")})
    assert response.status_code == 403
    token = csrf_token(client, "/admin/login/")
    response = client.post(
        "/admin/login/",
        {
            "username": "root",
            "password": password_of("root"),
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        },
    )
    assert response.status_code == 302


def test_every_admin_form_requires_csrf(world):
    """A logged-in admin's POST to any admin form without the CSRF token is a 403 and changes
    nothing (as a forged cross-site form would be)."""
    job_submit(user=world.users["bob"], share_name="research", gpu_type="h100", gpus=8,
               command="true")  # fmt: skip
    client = csrf_client(world.users["root"])
    urls = admin_form_urls(world)
    assert len(urls) > 20
    before = (Job.objects.count(), ClusterSettings.load().agent_join_token)
    for url in urls:
        response = client.post(url, {"action": "delete_selected", "_selected_action": ["1"],
                                     "post": "yes", "agent_join_token": "evil"})  # fmt: skip
        assert response.status_code == 403, url
        assert b"CSRF" in response.content, url
    assert (Job.objects.count(), ClusterSettings.load().agent_join_token) == before


def test_admin_change_form_accepts_its_own_token(world):
    """The same admin form with the token it rendered is accepted (the check is not just
    refusing everything)."""
    client = csrf_client(world.users["root"])
    url = reverse("admin:scheduler_clustersettings_change", args=[1])
    token = csrf_token(client, url)
    response = client.post(url, {"agent_join_token": "a-new-join-token",
                                 "churn_preemptions": "3", "churn_window_seconds": "3600",
                                 "csrfmiddlewaretoken": token})  # fmt: skip
    assert response.status_code == 302, response.content[:500]
    assert ClusterSettings.load().agent_join_token == "a-new-join-token"


# --- CSRF on the API ----------------------------------------------------------------------------

UNSAFE_API_CALLS = [
    ("post", "/api/v1/jobs/", job_request()),
    ("post", "/api/v1/jobs/{job}/cancel/", None),
    ("patch", "/api/v1/jobs/{job}/", {"priority": 3}),
    ("patch", "/api/v1/shares/research/", {"weight": 2}),
    ("post", "/api/v1/shares/research/disable/", None),
    ("post", "/api/v1/nodes/h100-0/drain/", None),
]


@pytest.mark.parametrize(("method", "path", "body"), UNSAFE_API_CALLS)
def test_session_authenticated_api_writes_require_csrf(world, method, path, body):
    """A browser session (the admin's) cannot write through the API without the CSRF token;
    with the token from its cookie it can."""
    job, _ = job_submit(user=world.users["bob"], share_name="research", gpu_type="h100",
                        gpus=8, command="true")  # fmt: skip
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world.users["root"])
    path = path.format(job=job.pk)
    call = getattr(client, method)
    response = call(path, body, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    client.get("/admin/")  # sets the csrftoken cookie, as any page does
    token = client.cookies["csrftoken"].value
    response = call(path, body, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code in (200, 201), response.content


@pytest.mark.parametrize(("method", "path", "body"), UNSAFE_API_CALLS)
def test_token_authenticated_api_writes_need_no_csrf(world, method, path, body):
    """Pipelines send a token, not a cookie: no CSRF token needed (and none is possible)."""
    job, _ = job_submit(user=world.users["bob"], share_name="research", gpu_type="h100",
                        gpus=8, command="true")  # fmt: skip
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {world.tokens['root']}")
    response = getattr(client, method)(path.format(job=job.pk), body, format="json")
    assert response.status_code in (200, 201), response.content


# --- Admin-only ---------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["carol", "alice", "bob", "oscar"])
def test_admin_site_refuses_non_admins(world, persona):
    """Team leads and members have no admin site: every admin page sends them to the login,
    the join token page included."""
    client = Client()
    client.force_login(world.users[persona])
    for url in ["/admin/", reverse("admin:scheduler_clustersettings_change", args=[1]),
                reverse("admin:shares_quotashare_changelist")]:  # fmt: skip
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
        assert JOIN not in response.content.decode()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/shares/", {"name": "x", "team": "vision",
                                     "capacity_limits": {"h100": 1}}),
        ("patch", "/api/v1/shares/research/", {"weight": 3}),
        ("post", "/api/v1/shares/research/disable/", None),
        ("post", "/api/v1/shares/research/enable/", None),
        ("post", "/api/v1/nodes/h100-0/drain/", None),
        ("post", "/api/v1/nodes/h100-0/undrain/", None),
    ],
)  # fmt: skip
def test_admin_only_endpoints_refuse_the_team_lead(world, method, path, body):
    """Even the lead of the share's own team may not change shares or nodes: 403, and the
    share and node are as they were."""
    from scheduler.models import Node
    from shares.models import QuotaShare

    before = (list(QuotaShare.objects.values_list("name", "weight", "state")),
              list(Node.objects.values_list("name", "state")))  # fmt: skip
    response = getattr(world.client("alice"), method)(path, body, format="json")
    assert response.status_code == 403
    assert "only admins" in response.json()["detail"]
    after = (list(QuotaShare.objects.values_list("name", "weight", "state")),
             list(Node.objects.values_list("name", "state")))  # fmt: skip
    assert after == before


# --- Secrets ------------------------------------------------------------------------------------


def agent_round_trip(client: Client) -> tuple[str, dict]:
    """Register a node; returns its token and the header that authenticates it."""
    response = client.post(
        "/api/v1/agent/register/",
        {"join_token": JOIN, "name": "secret-node", "gpu_type": "h100", "gpus": 8},
        content_type="application/json",
    )
    assert response.status_code == 201
    token = response.json()["token"]
    auth = {"HTTP_AUTHORIZATION": f"Node {token}"}
    return token, auth


def test_tokens_only_in_the_response_that_issues_them(world, settings):
    """The node token is in the register response and nowhere else: not in poll or report
    answers, not in any API read (nodes, queue, jobs, shares), not in the schema. The join
    token appears in no API response at all."""
    settings.AGENT_POLL_MAX_WAIT_SECONDS = 0
    client = Client()
    token, auth = agent_round_trip(client)
    job, _ = job_submit(user=world.users["bob"], share_name="research", gpu_type="h100",
                        gpus=8, command="true")  # fmt: skip
    cycle_run(force=True)
    bodies = []
    poll = client.post("/api/v1/agent/poll/", {}, content_type="application/json", **auth)
    bodies.append(poll.content.decode())
    attempt = JobAttempt.objects.get(job=job)
    for event in (
        {"type": "started", "attempt": attempt.pk},
        {"type": "exited", "attempt": attempt.pk, "end": "exit", "exit_code": 0},
    ):
        bodies.append(
            client.post(
                "/api/v1/agent/report/",
                {"events": [event]},
                content_type="application/json",
                **auth,
            ).content.decode()
        )
    api = world.client("root")
    for path in ("/api/v1/nodes/", "/api/v1/nodes/secret-node/", "/api/v1/queue/",
                 "/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", "/api/v1/shares/",
                 "/api/v1/shares/research/", "/api/v1/shares/research/history/",
                 "/api/schema/", "/api/docs/"):  # fmt: skip
        response = api.get(path)
        assert response.status_code == 200, path
        bodies.append(response.content.decode())
    for body in bodies:
        assert token not in body
        assert JOIN not in body


def test_no_secret_in_server_logs(world, settings, caplog):
    """Registering (rightly and wrongly), polling and reporting, at DEBUG level, logs neither
    the join token nor the node token, nor a user's API token."""
    settings.AGENT_POLL_MAX_WAIT_SECONDS = 0
    caplog.set_level(logging.DEBUG)
    client = Client()
    client.post("/api/v1/agent/register/",
                {"join_token": JOIN + "-typo", "name": "n", "gpu_type": "h100", "gpus": 8},
                content_type="application/json")  # fmt: skip
    token, auth = agent_round_trip(client)
    job, _ = job_submit(user=world.users["bob"], share_name="research", gpu_type="h100",
                        gpus=8, command="true")  # fmt: skip
    cycle_run(force=True)
    client.post("/api/v1/agent/poll/", {}, content_type="application/json", **auth)
    attempt = JobAttempt.objects.get(job=job)
    client.post("/api/v1/agent/report/",
                {"events": [{"type": "exited", "attempt": attempt.pk, "end": "exit",
                             "exit_code": 1}]},
                content_type="application/json", **auth)  # fmt: skip
    client.post("/api/v1/agent/poll/", {}, content_type="application/json",
                HTTP_AUTHORIZATION=f"Node {token}x")  # fmt: skip
    world.client("bob").post("/api/v1/jobs/", {"share": "nope"}, format="json")
    assert caplog.records, "nothing was logged: the capture is not working"
    logged = "\n".join(
        f"{record.getMessage()} {record.args!r} {record.__dict__.get('request', '')!r}"
        for record in caplog.records
    )
    for secret in (JOIN, token, world.tokens["bob"]):
        assert secret not in logged


def test_secret_key_in_no_page(world):
    """SECRET_KEY appears in no page an admin, a member or an anonymous visitor can open,
    error pages included."""
    secret = settings.SECRET_KEY
    admin_client = Client()
    admin_client.force_login(world.users["root"])
    pages = ["/", "/health/", "/admin/", "/admin/login/", "/api/schema/", "/api/docs/",
             "/api/v1/nodes/", "/api/v1/queue/", "/api/v1/shares/", "/api/nope/",
             "/no-such-page/", "/api/v1/jobs/999999/"]  # fmt: skip
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        pages.append(reverse("admin:{}_{}_changelist".format(*info)))
        pages.append(reverse("admin:{}_{}_add".format(*info)))
    pages.append(reverse("admin:scheduler_clustersettings_change", args=[1]))
    for client in (admin_client, Client(), world.client("bob")):
        for page in pages:
            response = client.get(page, follow=True)
            assert response.status_code < 500, page
            assert secret not in response.content.decode(errors="replace"), page
