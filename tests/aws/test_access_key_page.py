"""Everyone signed in makes, lists and revokes their own AWS access keys on /dash/aws-keys/: the
secret is shown once and signs at once; a user holds at most two active keys, as on AWS."""

from __future__ import annotations

import re

import pytest

from awsbatch.keys import TOO_MANY_KEYS, access_key_secret, active_key
from awsbatch.models import AccessKey

pytestmark = pytest.mark.django_db

PAGE = "/dash/aws-keys/"


def made_on(page: str) -> tuple[str, str]:
    found = re.search(r"AWS_ACCESS_KEY_ID=(\w+)\nAWS_SECRET_ACCESS_KEY=(\S+)</pre>", page)
    assert found, page
    return found.group(1), found.group(2)


def test_the_page_needs_a_login(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and response.url == f"/dash/login/?next={PAGE}"


def test_a_member_makes_a_key_whose_secret_is_shown_once_and_signs(client, bob):
    client.force_login(bob)
    assert "No access key yet." in client.get(PAGE).content.decode()
    key_id, secret = made_on(client.post(PAGE, {"description": "nightly"}).content.decode())
    key = active_key(key_id)
    assert key is not None and key.user == bob and key.description == "nightly"
    assert access_key_secret(key) == secret  # what signing checks against
    listed = client.get(PAGE).content.decode()
    assert key_id in listed and secret not in listed and "never" in listed


def test_a_key_is_revoked_by_its_user_only(client, bob, alice):
    client.force_login(alice)
    alices, _ = made_on(client.post(PAGE).content.decode())
    client.force_login(bob)
    bobs, _ = made_on(client.post(PAGE).content.decode())
    assert client.post(f"{PAGE}{alices}/revoke/").status_code == 404
    assert active_key(alices) is not None
    response = client.post(f"{PAGE}{bobs}/revoke/")
    assert response.status_code == 302 and response.url == PAGE
    assert active_key(bobs) is None
    assert "revoked" in client.get(PAGE).content.decode()


def test_at_most_two_active_keys(client, bob):
    client.force_login(bob)
    first, _ = made_on(client.post(PAGE).content.decode())
    made_on(client.post(PAGE).content.decode())
    refused = client.post(PAGE)
    assert refused.status_code == 400 and TOO_MANY_KEYS in refused.content.decode()
    assert AccessKey.objects.filter(user=bob).count() == 2
    client.post(f"{PAGE}{first}/revoke/")
    made_on(client.post(PAGE).content.decode())
