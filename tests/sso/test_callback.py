"""The callback's answers to a browser that comes back wrong: a page that says what happened,
never a 500 (no provider needs to answer for these)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils.html import escape

from sso.models import LoginRecord
from sso.views import LOGIN_EXPIRED, PROVIDER_ERROR, WRONG_PROVIDER

pytestmark = pytest.mark.django_db


def test_a_code_from_another_provider_is_refused_before_it_is_used(sso_on):
    """RFC 9207: the redirect names its issuer; another provider's is refused at once."""
    response = Client().get("/sso/callback/?code=c&state=s&iss=https://impostor.example")
    reason = WRONG_PROVIDER.format(
        issuer="https://impostor.example", expected="https://idp.example.org"
    )
    assert response.status_code == 403 and escape(reason) in response.content.decode()
    assert LoginRecord.objects.get().reason == reason


def test_a_callback_this_browser_did_not_start_asks_to_start_again(sso_on):
    """No login started in this session, or another one: the person is asked to start again."""
    client = Client()
    assert client.get("/sso/callback/?code=c&state=s").status_code == 400
    session = client.session  # as /sso/login/ leaves it, for another login than this one
    session["oidc_states"] = {"mine": {"nonce": "n", "code_verifier": "v", "added_on": 0}}
    session.save()
    response = client.get("/sso/callback/?code=c&state=not-this-one")
    assert response.status_code == 400
    assert escape(LOGIN_EXPIRED) in response.content.decode()


def test_a_person_who_cancels_at_the_provider_is_told_so(sso_on):
    response = Client().get(
        "/sso/callback/?error=access_denied&error_description=End-User+aborted+interaction&state=s"
    )
    reason = PROVIDER_ERROR.format(error="End-User aborted interaction")
    assert response.status_code == 403 and escape(reason) in response.content.decode()
    assert LoginRecord.objects.get().outcome == LoginRecord.Outcome.REFUSED
