"""Every endpoint × every persona: admin (root), the lender team's lead (carol), the borrower
team's lead (alice), a member of the borrower team (bob), an outsider (oscar), anonymous.

What a user may not see is a 404 with no trace of its data; what they may see but not change
is a 403."""

from __future__ import annotations

import pytest

from scheduler.jobs.services import job_submit
from scheduler.models import Job
from tests.api.helpers import job_request
from tests.conftest import password_of

ANON = None
COLUMNS = ("root", "carol", "alice", "bob", "oscar", ANON)
SECRET = "python secret_experiment.py"

# Node tokens: the agent branch adds a `node` persona here. A node token must get 401/403 on
# every endpoint below, and only node tokens reach /api/v1/agent/.
NODE_TOKEN_COLUMN = "node"

# (method, path, body, expected statuses in COLUMNS order). {bob_job} is bob's job in
# research; {alice_job} alice's; {vision_job} carol's job in vision.
MATRIX = [
    ("get", "/api/v1/jobs/", None, (200, 200, 200, 200, 200, 401)),
    ("post", "/api/v1/jobs/", job_request(), (201, 404, 201, 201, 404, 401)),
    ("post", "/api/v1/jobs/", job_request(share="vision"), (201, 201, 404, 404, 404, 401)),
    ("get", "/api/v1/jobs/{bob_job}/", None, (200, 404, 200, 200, 404, 401)),
    ("get", "/api/v1/jobs/{vision_job}/", None, (200, 200, 404, 404, 404, 401)),
    ("patch", "/api/v1/jobs/{bob_job}/", {"priority": 5}, (200, 404, 200, 403, 404, 401)),
    ("post", "/api/v1/jobs/{bob_job}/cancel/", None, (200, 404, 200, 200, 404, 401)),
    ("post", "/api/v1/jobs/{alice_job}/cancel/", None, (200, 404, 200, 403, 404, 401)),
    ("get", "/api/v1/shares/", None, (200, 200, 200, 200, 200, 401)),
    (
        "post",
        "/api/v1/shares/",
        {"name": "new", "team": "vision", "capacity_limits": {"h100": 1}},
        (201, 403, 403, 403, 403, 401),
    ),
    ("get", "/api/v1/shares/research/", None, (200, 404, 200, 200, 404, 401)),
    ("patch", "/api/v1/shares/research/", {"weight": 2}, (200, 404, 403, 403, 404, 401)),
    ("post", "/api/v1/shares/research/disable/", None, (200, 404, 403, 403, 404, 401)),
    ("post", "/api/v1/shares/research/enable/", None, (200, 404, 403, 403, 404, 401)),
    ("get", "/api/v1/shares/research/history/", None, (200, 404, 200, 200, 404, 401)),
    ("get", "/api/v1/shares/research/usage/", None, (200, 404, 200, 200, 404, 401)),
    ("get", "/api/v1/shares/vision/usage/", None, (200, 200, 404, 404, 404, 401)),
    ("get", "/api/v1/queue/", None, (200, 200, 200, 200, 200, 401)),
    ("get", "/api/v1/nodes/", None, (200, 200, 200, 200, 200, 401)),
    ("get", "/api/v1/nodes/h100-0/", None, (200, 200, 200, 200, 200, 401)),
    ("post", "/api/v1/nodes/h100-0/drain/", None, (200, 403, 403, 403, 403, 401)),
    ("post", "/api/v1/nodes/h100-0/undrain/", None, (200, 403, 403, 403, 403, 401)),
    ("get", "/api/schema/", None, (200, 200, 200, 200, 200, 200)),
    ("get", "/api/docs/", None, (200, 200, 200, 200, 200, 200)),
]

CASES = [
    pytest.param(method, path, body, persona, expected[i], id=f"{method} {path} as {persona}")
    for method, path, body, expected in MATRIX
    for i, persona in enumerate(COLUMNS)
]


def submit(world, persona: str, share: str, command: str = SECRET) -> Job:
    job, _ = job_submit(
        user=world.users[persona], share_name=share, gpu_type="h100", gpus=8, command=command
    )
    return job


@pytest.mark.parametrize(("method", "path", "body", "persona", "expected"), CASES)
def test_permission_matrix(world, method, path, body, persona, expected):
    """Each persona gets exactly the status the matrix says, and a 404 carries no data."""
    jobs = {
        "bob_job": submit(world, "bob", "research").pk,
        "alice_job": submit(world, "alice", "research").pk,
        "vision_job": submit(world, "carol", "vision").pk,
    }
    response = getattr(world.client(persona), method)(
        path.format(**jobs), body, format="json" if body is not None else None
    )
    assert response.status_code == expected, response.content
    if expected in (401, 403, 404):
        assert SECRET not in response.content.decode()


# Public pages: they describe the API and hold no data, so any caller gets them.
PUBLIC_PATHS = ("/api/schema/", "/api/docs/")
NODE_CASES = [
    pytest.param(method, path, body, scheme, id=f"{method} {path} with {scheme} <node token>")
    for method, path, body, _ in MATRIX
    if path not in PUBLIC_PATHS
    for scheme in ("Node", "Token", "Bearer")
]


def node_token(world) -> str:
    """A node registers over the agent API and gets its own token."""
    from django.test import Client

    from scheduler.models import ClusterSettings

    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": "join-secret"})
    response = Client().post(
        "/api/v1/agent/register/",
        {"join_token": "join-secret", "name": "agent-node", "gpu_type": "h100", "gpus": 8},
        content_type="application/json",
    )
    assert response.status_code == 201
    return response.json()["token"]


@pytest.mark.parametrize(("method", "path", "body", "scheme"), NODE_CASES)
def test_node_token_reaches_no_user_endpoint(world, method, path, body, scheme):
    """The NODE_TOKEN_COLUMN: a node token, sent with any scheme, gets 401/403 on every user
    endpoint of MATRIX, and nothing it should not see."""
    token = node_token(world)
    jobs = {
        "bob_job": submit(world, "bob", "research").pk,
        "alice_job": submit(world, "alice", "research").pk,
        "vision_job": submit(world, "carol", "vision").pk,
    }
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {token}")
    response = getattr(client, method)(
        path.format(**jobs), body, format="json" if body is not None else None
    )
    assert response.status_code in (401, 403), (NODE_TOKEN_COLUMN, response.content)
    assert SECRET not in response.content.decode()


@pytest.mark.parametrize("path", ["poll", "report"])
@pytest.mark.parametrize("scheme", ["Node", "Token"])
@pytest.mark.parametrize("persona", ["root", "bob"])
def test_user_token_reaches_no_agent_endpoint(world, path, scheme, persona):
    """A user's API token (even an admin's) is not a node token: 401 on the agent endpoints."""
    from django.test import Client

    response = Client().post(
        f"/api/v1/agent/{path}/",
        {"events": []} if path == "report" else {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"{scheme} {world.tokens[persona]}",
    )
    assert response.status_code == 401


def test_user_token_is_not_a_join_token(world):
    """Registering a node takes the cluster's join token, not a user's API token."""
    from django.test import Client

    response = Client().post(
        "/api/v1/agent/register/",
        {"join_token": world.tokens["root"], "name": "sneaky", "gpu_type": "h100", "gpus": 8},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {world.tokens['root']}",
    )
    assert response.status_code == 403


def test_listing_shows_only_your_teams_jobs(world):
    """bob sees research's jobs (his and alice's), never vision's; root sees all."""
    submit(world, "bob", "research")
    submit(world, "alice", "research")
    submit(world, "carol", "vision")
    shares_seen = {
        persona: {
            job["share"] for job in world.client(persona).get("/api/v1/jobs/").json()["results"]
        }
        for persona in ("root", "bob", "carol", "oscar")
    }
    assert shares_seen == {
        "root": {"research", "vision"},
        "bob": {"research"},
        "carol": {"vision"},
        "oscar": set(),
    }


def test_share_list_shows_only_your_teams_shares(world, inference_share):
    names = {
        persona: [share["name"] for share in world.client(persona).get("/api/v1/shares/").json()]
        for persona in ("root", "alice", "carol", "oscar")
    }
    assert names == {
        "root": ["inference", "research", "vision"],
        "alice": ["research"],
        "carol": ["vision"],
        "oscar": [],
    }


def test_queue_hides_other_teams_jobs_but_keeps_positions(world):
    """bob sees his team's queued jobs at their place in the whole queue, not vision's."""
    vision_job = submit(world, "carol", "vision")
    bob_job = submit(world, "bob", "research")
    front = world.client("bob").get("/api/v1/queue/").json()["front"]
    assert [(entry["position"], entry["job"]["id"]) for entry in front] == [(2, bob_job.pk)]
    assert vision_job.pk not in [entry["job"]["id"] for entry in front]
    assert set(world.client("bob").get("/api/v1/queue/").json()["shares"]) == {"research"}


def test_member_cancels_own_job_but_not_a_teammates(world):
    """bob cancels his own job; alice's job is the lead's to manage, so bob gets a 403."""
    own = submit(world, "bob", "research")
    teammate = submit(world, "alice", "research")
    bob = world.client("bob")
    assert bob.post(f"/api/v1/jobs/{own.pk}/cancel/").json()["state"] == "CANCELLED"
    response = bob.post(f"/api/v1/jobs/{teammate.pk}/cancel/")
    assert response.status_code == 403
    assert response.json()["detail"] == (
        "only the job's submitter, a lead of team ml-research or an admin may cancel this job."
    )


def test_session_login_works_like_a_token(world):
    """The browser session authenticates too."""
    from rest_framework.test import APIClient

    client = APIClient()
    assert client.login(username="bob", password=password_of("bob"))
    assert client.get("/api/v1/shares/research/").status_code == 200
    assert client.get("/api/v1/shares/vision/").status_code == 404


@pytest.mark.parametrize(
    ("authorization", "detail"),
    [
        (None, "Authentication credentials were not provided."),
        ("Token", "Invalid token header. No credentials provided."),
        ("Token a b", "Invalid token header. Token string should not contain spaces."),
        ("token not-a-token", "Invalid token."),
        ("Bearer whatever", "Authentication credentials were not provided."),
    ],
)
def test_token_header_problems_are_401_with_drfs_messages(world, authorization, detail):
    """A missing, malformed or unknown token gets DRF's own 401 answer, and no job."""
    from rest_framework.test import APIClient

    client = APIClient()
    if authorization is not None:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    response = client.post("/api/v1/jobs/", job_request(), format="json")
    assert (response.status_code, response.json()["detail"]) == (401, detail)
    assert response["WWW-Authenticate"] == "Token"
    assert not Job.objects.exists()
