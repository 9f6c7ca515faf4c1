"""Logging in through a real OpenID provider (oidc-provider, run with node) in a real browser
(Playwright + Debian's Chromium): the authorization code flow with PKCE, group claims applied
as teams and roles at each login, and every way the provider can let the login down ending on
a page that says what happened, never a 500."""

from __future__ import annotations

from urllib.parse import parse_qs, urljoin, urlsplit

import jwt
import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore

from shares.models import Membership
from sso.backends import BAD_SIGNATURE, EXPIRED_TOKEN, WRONG_ISSUER
from sso.models import GroupMapping, LoginRecord, ProviderIdentity
from sso.views import PROVIDER_DOWN
from tests.sso.oidc_provider import CLIENT_ID, CLIENT_SECRET

pytestmark = [pytest.mark.live, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "dana-at-the-idp"


@pytest.fixture
def mappings(vision_team, research_team):
    """gpu-vision-leads lead vision, gpu-research are members of ML Research, gpu-admins are
    portal admins."""
    GroupMapping.objects.create(group="gpu-vision-leads", team=vision_team, role="LEAD")
    GroupMapping.objects.create(group="gpu-research", team=research_team, role="MEMBER")
    GroupMapping.objects.create(group="gpu-admins", role="ADMIN")


def requests_to(page, prefix: str) -> list[str]:
    """The URLs of the page's requests from now on that start with `prefix`, as they are made."""
    urls: list[str] = []
    page.on(
        "request",
        lambda request: urls.append(request.url) if request.url.startswith(prefix) else None,
    )
    return urls


def start_login(page, live_server, next_path: str = "/dash/"):
    """Opens the dashboards' login page and follows its single sign-on button."""
    page.goto(f"{live_server.url}/dash/login/?next={next_path}")
    assert page.locator("input[name=password]").count() == 0  # passwords: break-glass only
    return page.click("#sso-login")


def sign_in_at_provider(page, provider, username: str, password: str = PASSWORD) -> None:
    page.wait_for_url(f"{provider.issuer}/interaction/**")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def failure_reason(page) -> str:
    return page.locator("#login-failed-reason").inner_text()


def test_the_code_flow_with_pkce_logs_a_lead_in_to_the_dashboards_admin_and_api(
    live_server, browser, oidc_provider, mappings, vision_share
):
    """dana signs in at the provider's own page; the portal sends a PKCE challenge (S256), gets
    the code back, and dana is the lead of vision and an admin, on the dashboards, in the admin
    and in the API's session."""
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-vision-leads", "gpu-admins"])
    authorize_urls = requests_to(page, f"{oidc_provider.issuer}/auth?")
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/dash/")
    assert page.locator("header .user").inner_text() == "dana"

    query = parse_qs(urlsplit(authorize_urls[0]).query)
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43  # base64url of a SHA-256
    assert "code_verifier" not in query  # the verifier goes only to the token endpoint

    dana = get_user_model().objects.get(username="dana")
    assert not dana.has_usable_password()
    assert [(m.team.slug, m.role) for m in dana.memberships.all()] == [("vision", "LEAD")]
    assert dana.is_staff and dana.is_superuser
    assert page.goto(f"{live_server.url}/admin/").status == 200
    assert page.locator("#site-name").count() == 1 and "/admin/login/" not in page.url
    shares = page.request.get(f"{live_server.url}/api/v1/shares/")
    assert shares.status == 200 and [s["name"] for s in shares.json()] == ["vision"]

    record = LoginRecord.objects.get()
    assert record.outcome == LoginRecord.Outcome.LOGGED_IN and record.user == dana
    assert record.groups == ["gpu-vision-leads", "gpu-admins"]
    assert record.memberships == {"vision": "LEAD"} and record.admin
    assert record.changes == ["joined vision as lead", "became an admin"]


def test_groups_that_change_between_two_logins_change_teams_and_roles(
    live_server, browser, oidc_provider, mappings
):
    """dana leads vision and is an admin at her first login; the provider then moves her to the
    research group only: at her next login she has left vision, joined ML Research as a
    member and lost the admin, and both logins are recorded with what they changed."""
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-vision-leads", "gpu-admins"])
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/dash/")
    page.click("form.logout button")
    page.wait_for_url(f"{live_server.url}/dash/login/**")

    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-research"])
    start_login(page, live_server, next_path="/admin/")
    # Still signed in at the provider: it sends her straight back, with her new groups.
    page.wait_for_url(f"{live_server.url}/admin/login/**")
    assert "not authorized to access this page" in page.content()

    dana = get_user_model().objects.get(username="dana")
    assert [(m.team.slug, m.role) for m in dana.memberships.all()] == [("ml-research", "MEMBER")]
    assert not dana.is_staff and not dana.is_superuser
    first, second = LoginRecord.objects.order_by("at", "id")
    assert first.changes == ["joined vision as lead", "became an admin"]
    assert second.groups == ["gpu-research"]
    assert second.memberships == {"ml-research": "MEMBER"} and not second.admin
    assert second.changes == ["joined ml-research as member", "left vision", "no longer an admin"]
    assert page.goto(f"{live_server.url}/dash/queue/").status == 403  # a member is no lead


def test_memberships_of_teams_no_mapping_names_are_left_alone(
    live_server, browser, oidc_provider, settings, vision_team, research_team
):
    """Only the teams the mapping table names follow the groups: a membership the admin gave
    by hand on another team survives the login. (Here the portal reads the groups from the ID
    token alone, as with Entra ID: no userinfo endpoint.)"""
    settings.OIDC_OP_USER_ENDPOINT = ""
    GroupMapping.objects.create(group="gpu-research", team=research_team, role="LEAD")
    dana = get_user_model().objects.create_user("dana")
    Membership.objects.create(team=vision_team, user=dana, role="MEMBER")
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-research"])
    ProviderIdentity.objects.create(user=dana, issuer=oidc_provider.issuer, subject="dana")
    page = browser
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/dash/")
    assert sorted((m.team.slug, m.role) for m in dana.memberships.all()) == [
        ("ml-research", "LEAD"),
        ("vision", "MEMBER"),
    ]


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("wrong-issuer", WRONG_ISSUER.format(issuer="http://impostor.invalid",
                                             expected="http://127.0.0.1:18411")),
        ("expired", EXPIRED_TOKEN),
        ("tampered", BAD_SIGNATURE),
    ],
)  # fmt: skip
def test_an_id_token_from_another_issuer_expired_or_tampered_logs_nobody_in(
    live_server, browser, oidc_provider, mappings, how, reason
):
    """The provider's token endpoint hands over an ID token signed by another issuer, one whose
    expiry is past, or one whose payload was changed (an admin group added) under the genuine
    signature: the portal says why on its page, logs nobody in and records the refusal."""
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-research"])
    oidc_provider.break_id_tokens(how)
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/sso/callback/**")
    assert failure_reason(page) == reason

    assert not get_user_model().objects.filter(username="dana").exists()
    record = LoginRecord.objects.get()
    assert record.outcome == LoginRecord.Outcome.REFUSED and record.reason == reason
    page.goto(f"{live_server.url}/dash/")
    assert "/dash/login/" in page.url  # not logged in


def test_a_provider_that_is_down_gets_a_clear_page_before_and_during_the_login(
    live_server, browser, oidc_provider, mappings
):
    """With the provider stopped, the login button leads to the portal's page saying the
    provider is not answering (503), not to the browser's error page; and when it stops while
    the person is signing in, the callback says the same instead of a 500."""
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-research"])
    expected = PROVIDER_DOWN.format(provider="Test IdP")

    oidc_provider.stop()
    page.goto(f"{live_server.url}/dash/login/?next=/dash/")
    with page.expect_response(f"{live_server.url}/sso/login/**") as response:
        page.click("#sso-login")
    assert response.value.status == 503
    assert failure_reason(page) == expected

    oidc_provider.start()
    oidc_provider.go_down_after_the_code()
    start_login(page, live_server)
    with page.expect_response(f"{live_server.url}/sso/callback/**") as response:
        sign_in_at_provider(page, oidc_provider, "dana")
    assert response.value.status == 503
    assert failure_reason(page) == expected
    assert not get_user_model().objects.filter(username="dana").exists()
    assert [r.outcome for r in LoginRecord.objects.all()] == ["REFUSED", "REFUSED"]


def test_a_wrong_password_at_the_provider_stays_at_the_provider(
    live_server, browser, oidc_provider, mappings
):
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-research"])
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana", password="not-it")
    assert page.locator(".error").inner_text() == "Wrong username or password."
    assert not get_user_model().objects.filter(username="dana").exists()


def test_logging_out_ends_the_session_at_the_provider_so_the_next_login_asks_the_password(
    live_server, browser, oidc_provider, settings, mappings
):
    """With OIDC_OP_LOGOUT_ENDPOINT set, the dashboards' "log out" sends dana to the provider's
    end-session endpoint with her ID token as the hint and the dashboards' login page to come
    back to; once she confirms there, she is back on that page, logged out of both: the next
    login shows the provider's sign-in page again instead of coming straight back."""
    settings.OIDC_OP_LOGOUT_ENDPOINT = oidc_provider.end_session_endpoint
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-vision-leads"])
    end_session_urls = requests_to(page, f"{oidc_provider.end_session_endpoint}?")
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/dash/")
    page.click("form.logout button")
    page.click("button[name=logout][value=yes]")  # the provider's "Yes, sign me out"
    page.wait_for_url(f"{live_server.url}/dash/login/")

    query = parse_qs(urlsplit(end_session_urls[0]).query)
    assert query["post_logout_redirect_uri"] == [f"{live_server.url}/dash/login/"]
    assert query["client_id"] == [CLIENT_ID]
    hint = jwt.decode(query["id_token_hint"][0], options={"verify_signature": False})
    assert (hint["iss"], hint["sub"], hint["aud"]) == (oidc_provider.issuer, "dana", CLIENT_ID)

    page.goto(f"{live_server.url}/dash/")
    assert "/dash/login/" in page.url  # logged out of the portal
    start_login(page, live_server)
    page.wait_for_url(f"{oidc_provider.issuer}/interaction/**")  # and of the provider
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_url(f"{live_server.url}/dash/")
    assert LoginRecord.objects.filter(outcome=LoginRecord.Outcome.LOGGED_IN).count() == 2


def test_the_provider_exchanges_the_code_only_with_the_pkce_verifier(
    live_server, browser, oidc_provider, mappings, settings
):
    """Someone who steals the code on its way back (here the test, stopping the browser before
    the portal's callback) cannot use it: the authorization request carried an S256 challenge,
    so without the portal's verifier the provider's token endpoint refuses the code."""
    page = browser
    oidc_provider.set_user("dana", password=PASSWORD, groups=["gpu-vision-leads"])
    authorize_urls = requests_to(page, f"{oidc_provider.issuer}/auth?")
    callback_urls = []

    def steal_the_code(route):
        # Playwright routes no redirected request, so the test follows the provider's
        # redirects itself (with the browser's cookies) up to the one back to the portal.
        response = route.fetch(max_redirects=0)
        while response.status in (302, 303) and not callback_urls:
            location = urljoin(response.url, response.headers["location"])
            if location.startswith(f"{live_server.url}/sso/callback/"):
                callback_urls.append(location)
            else:
                response = page.request.get(location, max_redirects=0)
        route.fulfill(status=200, body="stopped before the portal's callback")

    page.route(f"{oidc_provider.issuer}/interaction/*/login", steal_the_code)
    start_login(page, live_server)
    sign_in_at_provider(page, oidc_provider, "dana")
    page.wait_for_load_state()

    challenge = parse_qs(urlsplit(authorize_urls[0]).query)
    assert challenge["code_challenge_method"] == ["S256"] and challenge["code_challenge"]
    callback = parse_qs(urlsplit(callback_urls[0]).query)
    exchange = {
        "grant_type": "authorization_code",
        "code": callback["code"][0],
        "redirect_uri": oidc_provider.redirect_uri,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
    }
    token_endpoint = f"{oidc_provider.issuer}/token"
    response = requests.post(token_endpoint, data=exchange, timeout=5)
    assert response.status_code == 400 and response.json()["error"] == "invalid_grant"
    assert not get_user_model().objects.filter(username="dana").exists()

    # The verifier is what was missing: the portal's, from its session, makes the same
    # exchange good.
    (session_id,) = [
        c["value"]
        for c in page.context.cookies(live_server.url)
        if c["name"] == settings.SESSION_COOKIE_NAME
    ]
    states = SessionStore(session_key=session_id).load()["oidc_states"]
    verifier = states[callback["state"][0]]["code_verifier"]
    response = requests.post(
        token_endpoint, data={**exchange, "code_verifier": verifier}, timeout=5
    )
    assert response.status_code == 200 and response.json()["id_token"]
