"""Everyone signed in makes their own API token on /dash/token/ (a member, an SSO user without a
shell): its key is shown once, it works on the API at once, and a new one replaces it."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

PAGE = "/dash/token/"


def key_on(page: str) -> str | None:
    found = re.search(r'<code id="token">([0-9a-f]{40})</code>', page)
    return found.group(1) if found else None


def api_answers(key: str) -> int:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api.get("/api/v1/shares/").status_code


def test_the_page_needs_a_login(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and response.url == f"/dash/login/?next={PAGE}"


def test_a_member_makes_a_token_that_works_and_is_shown_once(client, bob, research_share):
    client.force_login(bob)
    before = client.get(PAGE).content.decode()
    assert 'id="no-token"' in before and "Make my token" in before
    assert 'href="/dash/token/"' in before  # in the header, for everyone signed in
    made = client.post(PAGE).content.decode()
    key = key_on(made)
    assert key and f"PORTAL_TOKEN={key}" in made
    assert api_answers(key) == 200
    again = client.get(PAGE).content.decode()
    assert 'id="has-token"' in again and key not in again and "Replace my token" in again


def test_a_new_token_replaces_the_old_one_and_no_one_elses(client, bob, alice, research_share):
    client.force_login(alice)
    alices = key_on(client.post(PAGE).content.decode())
    client.force_login(bob)
    first = key_on(client.post(PAGE).content.decode())
    second = key_on(client.post(PAGE).content.decode())
    assert first != second
    assert api_answers(first) == 401
    assert api_answers(second) == 200
    assert api_answers(alices) == 200


def test_the_page_takes_only_get_and_post(client, bob):
    client.force_login(bob)
    assert client.put(PAGE).status_code == 405
