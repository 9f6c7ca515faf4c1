"""Fixtures of the single sign-on tests: the OpenID provider (a real one, started once for the
session beside pytest-django's live server), the portal's settings pointing at it, a browser."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connections

from tests.sso.oidc_provider import CLIENT_ID, CLIENT_SECRET, OidcProvider, provider_missing

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def oidc_provider_process(live_server, tmp_path_factory):
    if why := provider_missing():
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("oidc-provider")
    provider = OidcProvider(
        folder / "state.json",
        f"{live_server.url}/sso/callback/",
        folder / "provider.log",
        post_logout_redirect_uris=(
            f"{live_server.url}/dash/login/",
            f"{live_server.url}/admin/login/",
        ),
    )
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture
def oidc_provider(oidc_provider_process, settings):
    """The provider, with no users and genuine ID tokens, and the portal set to log in
    through it (PASSWORD_LOGIN=admins). A test that stops it gets it started again."""
    provider = oidc_provider_process
    provider.reset()
    for name, value in provider.portal_settings().items():
        setattr(settings, name, value)
    yield provider
    if not provider.running:
        provider.start()


@pytest.fixture
def browser(monkeypatch):
    """A fresh Chromium context (no cookies of the portal or of the provider)."""
    if not CHROMIUM.exists():
        pytest.skip(
            "Chromium is not installed at /usr/bin/chromium and could not be: run "
            "scripts/install_browser.sh as root (scripts/test.sh does)."
        )
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls of the tests are
    # still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        context = chromium.new_context()
        yield context.new_page()
        connections.close_all()  # see tests/dashboards/test_dashboard_browser.py
        chromium.close()


@pytest.fixture
def sso_on(settings):
    """Single sign-on configured (no provider needs to answer for these pages)."""
    issuer = "https://idp.example.org"
    settings.OIDC_ENABLED = True
    settings.OIDC_PROVIDER_NAME = "Example IdP"
    settings.OIDC_OP_ISSUER = issuer
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{issuer}/auth"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{issuer}/token"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{issuer}/jwks"
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.PASSWORD_LOGIN = "admins"
    return settings
