"""Local passwords beside single sign-on (PASSWORD_LOGIN): everyone's without it (the
zero-setup default), the break-glass admin's only with it; API tokens work either way."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import password_of
from tests.portal.test_setup import settings_in_subprocess

pytestmark = pytest.mark.django_db


def log_in(page: str, persona: str) -> Client:
    client = Client()
    client.post(page, {"username": persona, "password": password_of(persona), "next": "/dash/"})
    return client


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_without_single_sign_on_everyone_logs_in_with_a_password_and_sees_no_sso_button(carol):
    page = Client().get("/dash/login/").content.decode()
    assert 'name="password"' in page and "sso-login" not in page
    assert "sso-login" not in Client().get("/admin/login/").content.decode()
    assert logged_in(log_in("/dash/login/", "carol"))
    assert Client().get("/sso/login/").status_code == 404
    assert Client().get("/sso/callback/?code=x&state=y").status_code == 404


def test_with_single_sign_on_only_the_break_glass_admin_logs_in_with_a_password(
    sso_on, carol, root
):
    """The dashboards' page offers only the provider; carol's right password opens nothing,
    neither there nor on the admin's page; root's opens the admin."""
    page = Client().get("/dash/login/?next=/dash/").content.decode()
    assert 'href="/sso/login/?next=/dash/"' in page and "Log in with Example IdP" in page
    assert 'name="password"' not in page
    admin_page = Client().get("/admin/login/?next=/admin/").content.decode()
    assert "Log in with Example IdP" in admin_page and 'name="password"' in admin_page
    assert not logged_in(log_in("/dash/login/", "carol"))
    assert not logged_in(log_in("/admin/login/", "carol"))
    root_client = log_in("/admin/login/", "root")
    assert logged_in(root_client)
    assert root_client.get("/admin/").status_code == 200


def test_password_login_none_leaves_only_the_provider(sso_on, root):
    sso_on.PASSWORD_LOGIN = "none"
    assert 'name="password"' not in Client().get("/admin/login/").content.decode()
    assert not logged_in(log_in("/admin/login/", "root"))


def test_api_tokens_work_as_before_with_single_sign_on(sso_on, world):
    response = world.client("bob").get("/api/v1/shares/")
    assert response.status_code == 200
    assert [share["name"] for share in response.json()] == ["research"]
    assert world.client(None).get("/api/v1/shares/").status_code in (401, 403)


def test_sso_is_off_by_default_and_on_needs_its_provider_settings():
    off = settings_in_subprocess("print(settings.OIDC_ENABLED, settings.PASSWORD_LOGIN)")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "all"]
    half = settings_in_subprocess(
        "print(settings.OIDC_ENABLED)",
        OIDC_ENABLED="true",
        OIDC_OP_ISSUER="https://idp.example.org",
        OIDC_RP_CLIENT_ID="portal",
    )
    assert half.returncode != 0
    assert (
        "OIDC_ENABLED is on but OIDC_OP_AUTHORIZATION_ENDPOINT, OIDC_OP_TOKEN_ENDPOINT, "
        "OIDC_OP_JWKS_ENDPOINT, OIDC_RP_CLIENT_SECRET not set: see docs/sso.md."
    ) in half.stderr
    bad = settings_in_subprocess("print(1)", PASSWORD_LOGIN="some")
    assert "PASSWORD_LOGIN: 'all', 'admins' or 'none', not 'some'." in bad.stderr
