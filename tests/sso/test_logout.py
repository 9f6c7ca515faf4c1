"""Logging out after a login through the provider (RP-initiated logout): with
OIDC_OP_LOGOUT_ENDPOINT set, the admin's and the dashboards' logout send the browser on to the
provider's end-session endpoint; without it, or for a local password, the logout is the
portal's alone, as before."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from sso.views import PROVIDER_BACKEND
from tests.conftest import password_of

pytestmark = pytest.mark.django_db

END_SESSION = "https://idp.example.org/session/end"


def logged_in_through_provider(user) -> Client:
    """A session as the provider's callback leaves it: its backend and the ID token."""
    client = Client()
    client.force_login(user, backend=PROVIDER_BACKEND)
    session = client.session
    session["oidc_id_token"] = "the.id.token"
    session.save()
    return client


def logged_out(client: Client) -> bool:
    return "_auth_user_id" not in client.session


@pytest.mark.parametrize(
    ("logout", "login"), [("/dash/logout/", "/dash/login/"), ("/admin/logout/", "/admin/login/")]
)
def test_logout_after_a_provider_login_ends_the_session_at_the_provider(
    sso_on, root, logout, login
):
    """The browser goes to the end-session endpoint with the ID token as hint, the client id,
    and the login page it logged out from to come back to."""
    sso_on.OIDC_OP_LOGOUT_ENDPOINT = END_SESSION
    client = logged_in_through_provider(root)
    response = client.post(logout)
    assert response.status_code == 302 and logged_out(client)
    url = urlsplit(response["Location"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == END_SESSION
    assert parse_qs(url.query) == {
        "id_token_hint": ["the.id.token"],
        "post_logout_redirect_uri": [f"http://testserver{login}"],
        "client_id": ["gpu-portal"],
    }


def test_without_the_logout_endpoint_logout_stays_the_portals(sso_on, root):
    client = logged_in_through_provider(root)
    response = client.post("/dash/logout/")
    assert response.status_code == 302 and response["Location"] == "/dash/"
    assert logged_out(client)
    client = logged_in_through_provider(root)
    response = client.post("/admin/logout/")
    assert response.status_code == 200 and "Logged out" in response.content.decode()
    assert logged_out(client)


def test_the_break_glass_password_login_logs_out_locally_only(sso_on, root):
    """root logged in with the local password: no ID token, no provider session to end."""
    sso_on.OIDC_OP_LOGOUT_ENDPOINT = END_SESSION
    client = Client()
    client.post("/admin/login/", {"username": "root", "password": password_of("root")})
    assert not logged_out(client)
    response = client.post("/admin/logout/")
    assert response.status_code == 200 and "Logged out" in response.content.decode()
    assert logged_out(client)
