"""What the reliability scenarios share: an API client that remembers what was accepted,
personas with API tokens, and polling helpers. Every wait is a poll with a generous bound."""

from __future__ import annotations

import uuid

import requests
from rest_framework.authtoken.models import Token

from scheduler.models import Job, JobAttempt, Node
from tests.live import job_command, wait_for

__all__ = ["ApiClient", "job_command", "outcomes", "wait_for", "wait_jobs", "wait_nodes"]


class ApiClient:
    """A REST client of the portal for one user. `submit` retries with the same client_token
    (the API makes that idempotent), so every job it returns an id for was accepted with a
    2xx; `accepted` holds those ids."""

    def __init__(self, url: str, user=None, *, token: str = "") -> None:
        self.url = url
        self.http = requests.Session()
        token = token or Token.objects.get_or_create(user=user)[0].key
        self.http.headers["Authorization"] = f"Token {token}"
        self.accepted: set[int] = set()

    def post(self, path: str, body: dict | None = None, timeout: float = 30):
        return self.http.post(f"{self.url}/api/v1/{path}", json=body or {}, timeout=timeout)

    def patch(self, path: str, body: dict, timeout: float = 30):
        return self.http.patch(f"{self.url}/api/v1/{path}", json=body, timeout=timeout)

    def get(self, path: str, timeout: float = 30):
        return self.http.get(f"{self.url}/api/v1/{path}", timeout=timeout)

    def try_submit(self, share: str, command: str, *, token: str, gpus: int = 1, **fields):
        """One POST; a 2xx adds the job to `accepted`. Returns the response."""
        body = {"share": share, "gpu_type": "h100", "gpus": gpus, "command": command,
                "client_token": token, **fields}  # fmt: skip
        response = self.post("jobs/", body)
        if response.status_code in (200, 201):
            self.accepted.add(response.json()["id"])
        return response

    def submit(self, share: str, command: str, *, gpus: int = 1, **fields) -> int:
        token = uuid.uuid4().hex
        response = self.try_submit(share, command, token=token, gpus=gpus, **fields)
        assert response.status_code == 201, (response.status_code, response.text)
        return response.json()["id"]


def wait_nodes(*names: str, timeout: float = 60) -> None:
    wait_for(
        lambda: Node.objects.filter(name__in=names, state=Node.State.READY).count() == len(names),
        timeout=timeout,
        what=f"nodes {names} registered",
    )


def wait_jobs(ids, *states: str, timeout: float = 90) -> None:
    """Wait until every job in `ids` is in one of `states`."""
    ids = set(ids)
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, state__in=states).count() == len(ids),
        timeout=timeout,
        what=f"jobs {sorted(ids)} in {states}",
    )


def outcomes(job_id: int) -> list[str]:
    return list(
        JobAttempt.objects.filter(job_id=job_id)
        .order_by("number")
        .values_list("outcome", flat=True)
    )
