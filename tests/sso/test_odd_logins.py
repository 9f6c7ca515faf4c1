"""Logins through the provider whose answers are odd: claims, audiences, names, sessions. The
provider's token endpoint and keys are answered by hand (no node, no browser), so each login is
the callback view with the ID token a test chooses."""

from __future__ import annotations

import json
import time

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.html import escape

from sso.models import GroupMapping, LoginRecord, ProviderIdentity
from sso.services import USERNAME_TAKEN
from sso.views import PROVIDER_BACKEND
from tests.sso.oidc_provider import CLIENT_ID

pytestmark = pytest.mark.django_db

ISSUER = "https://idp.example.org"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
JWK = {
    **json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key())),
    "kid": "k1",
    "alg": "RS256",
    "use": "sig",
}


class FakeResponse:
    def __init__(self, body, status=200, content_type="application/json"):
        self.status_code, self._body = status, body
        self.headers = {"content-type": content_type}
        self.text, self.url = json.dumps(body), "https://idp.example.org/x"

    def json(self):
        return self._body

    def raise_for_status(self):
        if self.status_code >= 400:
            raise requests.HTTPError(f"HTTP {self.status_code}", response=self)


def id_token(claims: dict, *, nonce="the-nonce", drop=(), **header) -> str:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "aud": CLIENT_ID,
        "sub": "sub-1",
        "iat": now,
        "exp": now + 300,
        "nonce": nonce,
        **claims,
    }
    for name in drop:
        payload.pop(name, None)
    return jwt.encode(payload, KEY, algorithm="RS256", headers={"kid": "k1", **header})


@pytest.fixture
def provider(sso_on, monkeypatch):
    """The provider's token endpoint gives `provider.token` as the ID token; its JWKS is JWK."""

    class Provider:
        token = None

    def post(url, **kwargs):
        assert url == f"{ISSUER}/token"
        return FakeResponse(
            {"id_token": Provider.token, "access_token": "at", "token_type": "Bearer"}
        )

    def get(url, **kwargs):
        assert url == f"{ISSUER}/jwks", url
        return FakeResponse({"keys": [JWK]})

    monkeypatch.setattr(requests, "post", post)
    monkeypatch.setattr(requests, "get", get)
    return Provider


def log_in(provider, claims: dict, *, client: Client | None = None, state="st", **token_kw):
    """The callback as the browser reaches it after the provider's sign-in page, for a login
    this browser started (its state and nonce in the session)."""
    client = client or Client()
    session = client.session
    session["oidc_states"] = {
        state: {"nonce": "the-nonce", "code_verifier": "v" * 64, "added_on": time.time()}
    }
    session.save()
    provider.token = id_token(claims, **token_kw)
    response = client.get(f"/sso/callback/?code=the-code&state={state}")
    return client, response


def test_a_provider_name_that_normalises_to_a_local_account_is_refused_with_the_message(
    provider, root
):
    """Django stores usernames NFKC-normalised: the full-width 'ｒｏｏｔ' is saved as 'root'.
    The check for an existing local account looks at the name before normalising, so the login
    ends in an IntegrityError (a 500) instead of docs/sso.md's "that login is refused, saying
    so"."""
    client = Client(raise_request_exception=False)
    _, response = log_in(
        provider, {"preferred_username": "\uff52\uff4f\uff4f\uff54", "sub": "s-fw"}, client=client
    )
    assert response.status_code == 403, response.status_code
    assert escape(USERNAME_TAKEN.split("{")[0]) in response.content.decode()
    assert not ProviderIdentity.objects.exists()
    assert LoginRecord.objects.get().outcome == LoginRecord.Outcome.REFUSED


@pytest.mark.parametrize(
    ("is_staff", "is_superuser"), [(True, False), (False, True)], ids=["staff", "superuser"]
)
def test_admin_rights_end_at_a_login_without_the_admin_group(
    provider, oscar, is_staff, is_superuser
):
    """docs/sso.md: "Admin rights follow the groups while at least one admin mapping exists".
    The portal's admin is staff *or* superuser (shares.selectors.is_admin), but the login only
    takes rights away from someone who is both: a staff-only (or superuser-only) person keeps
    every team's dashboards and shares after losing the admin group."""
    from shares.selectors import is_admin

    oscar.is_staff, oscar.is_superuser = is_staff, is_superuser
    oscar.save()
    ProviderIdentity.objects.create(user=oscar, issuer=ISSUER, subject="s-oscar")
    GroupMapping.objects.create(group="portal-admins", role="ADMIN")
    _, response = log_in(provider, {"preferred_username": "oscar", "sub": "s-oscar", "groups": []})
    assert response.status_code == 302
    oscar.refresh_from_db()
    assert not is_admin(oscar), (oscar.is_staff, oscar.is_superuser)
    assert LoginRecord.objects.get().changes == ["no longer an admin"]


def test_an_id_token_issued_to_another_application_is_refused(provider):
    """OpenID Connect Core 1.0 §3.1.3.7 item 3: the ID token MUST be rejected if it "contains
    additional audiences not trusted by the Client" (and items 4-5: azp, when present, is the
    client's id). docs/sso.md: the audience is checked. A token whose audiences are another
    application and the portal, authorised for the other application, logs in."""
    _, response = log_in(
        provider,
        {
            "preferred_username": "eve",
            "sub": "s-eve",
            "aud": ["other-app", CLIENT_ID],
            "azp": "other-app",
        },
    )
    assert response.status_code == 403
    assert not get_user_model().objects.filter(username="eve").exists()


def test_a_groups_claim_that_is_neither_a_list_nor_a_string_ends_on_the_login_page(provider):
    """The project's rule: a login fails with a clear message, never a 500. A groups claim that
    is a number (or true) makes groups_of raise TypeError: a 500, and nothing recorded."""
    client = Client(raise_request_exception=False)
    _, response = log_in(
        provider, {"preferred_username": "gina", "sub": "s-gina", "groups": 5}, client=client
    )
    assert response.status_code in (302, 403), response.status_code
    assert LoginRecord.objects.exists()


def test_a_provider_signing_with_ps256_does_not_break_the_login_page(provider, settings):
    """OIDC_RP_SIGN_ALGO=PS256 (an RSA algorithm providers offer) passes the start-up checks,
    then every login is a 500: mozilla-django-oidc uses the client secret as the key for any
    algorithm not starting RS/ES, and PyJWT's InvalidKeyError is not caught. The project's
    rules: settings errors are reported at start, and a login never ends in a 500."""
    settings.OIDC_RP_SIGN_ALGO = "PS256"
    client = Client(raise_request_exception=False)
    session = client.session
    session["oidc_states"] = {
        "st": {"nonce": "the-nonce", "code_verifier": "v" * 64, "added_on": time.time()}
    }
    session.save()
    now = int(time.time())
    provider.token = jwt.encode(
        {
            "iss": ISSUER,
            "aud": CLIENT_ID,
            "sub": "s-ps",
            "iat": now,
            "exp": now + 300,
            "nonce": "the-nonce",
            "preferred_username": "pat",
        },
        KEY,
        algorithm="PS256",
        headers={"kid": "k1"},
    )
    response = client.get("/sso/callback/?code=the-code&state=st")
    assert response.status_code in (302, 403), response.status_code


def test_a_claim_longer_than_its_field_is_refused_or_fits(provider):
    """A username (User.username: 150 characters) or an email (254) longer than its column is
    written as is: PostgreSQL answers DataError, a 500 (SQLite stores it). The login should be
    refused with a message, or the value made to fit, as the name already is ([:150])."""
    long_name, long_email = "x" * 200, "e" * 300 + "@example.org"
    client = Client(raise_request_exception=False)
    _, response = log_in(
        provider,
        {"preferred_username": long_name, "sub": "s-long", "email": long_email},
        client=client,
    )
    assert response.status_code in (302, 403)
    User = get_user_model()
    for user in User.objects.all():
        assert len(user.username) <= User._meta.get_field("username").max_length
        assert len(user.email) <= User._meta.get_field("email").max_length


def test_logout_ends_the_provider_session_after_switching_accounts_in_one_browser(
    provider, bob, settings
):
    """docs/sso.md: with OIDC_OP_LOGOUT_ENDPOINT set, logging out after a login through the
    provider goes to its end-session endpoint with the ID token kept in the session. When the
    browser was logged in as someone else (bob), the ID token is stored, then auth.login
    flushes the session for the new user: logout stays the portal's, and the person is still
    signed in at the provider."""
    end_session = f"{ISSUER}/session/end"
    settings.OIDC_OP_LOGOUT_ENDPOINT = end_session
    client = Client()
    client.force_login(bob, backend="sso.backends.PasswordBackend")
    _, response = log_in(provider, {"preferred_username": "dana", "sub": "s-dana"}, client=client)
    assert response.status_code == 302
    assert client.session["_auth_user_backend"] == PROVIDER_BACKEND
    response = client.post("/dash/logout/")
    assert response.status_code == 302
    assert response["Location"].startswith(end_session), response["Location"]


def start_login_states(client: Client, **started_ago: float) -> None:
    """Logins this browser started `started_ago[state]` seconds ago and never finished, as
    /sso/login/ leaves them in the session."""
    session = client.session
    session["oidc_states"] = {
        state: {"nonce": "the-nonce", "code_verifier": "v" * 64, "added_on": time.time() - ago}
        for state, ago in started_ago.items()
    }
    session.save()


def test_a_login_that_comes_back_after_its_lifetime_is_refused_as_expired(provider, settings):
    """A login's state and nonce were kept, and accepted, for ever: a callback that came back
    hours after the login started still logged the person in. Past OIDC_STATE_LIFETIME_SECONDS
    it is refused with a page that says the login link has expired, and the state is gone."""
    from sso.views import LOGIN_LINK_EXPIRED

    client = Client()
    start_login_states(client, old=settings.OIDC_STATE_LIFETIME_SECONDS + 60)
    provider.token = id_token({"preferred_username": "lena", "sub": "s-lena"})
    response = client.get("/sso/callback/?code=the-code&state=old")
    assert response.status_code == 400
    page = response.content.decode()
    assert escape(LOGIN_LINK_EXPIRED.format(lifetime="10 minutes")) in page
    assert not get_user_model().objects.filter(username="lena").exists()
    assert "old" not in client.session.get("oidc_states", {})


def test_a_login_within_its_lifetime_still_logs_in(provider, settings):
    client = Client()
    start_login_states(client, st=settings.OIDC_STATE_LIFETIME_SECONDS - 60)
    provider.token = id_token({"preferred_username": "lena", "sub": "s-lena"})
    response = client.get("/sso/callback/?code=the-code&state=st")
    assert response.status_code == 302
    assert get_user_model().objects.filter(username="lena").exists()


def test_the_states_of_logins_never_finished_are_dropped_when_another_starts(provider, settings):
    """Each login started and abandoned (a closed tab, a provider page left open) left its
    state, nonce and PKCE verifier in the session until mozilla-django-oidc's cap of 50: the
    expired ones are dropped when the next login starts; the recent one of another tab stays."""
    client = Client()
    lifetime = settings.OIDC_STATE_LIFETIME_SECONDS
    start_login_states(client, abandoned=lifetime + 1, other_tab=lifetime / 2)
    response = client.get("/sso/login/")
    assert response.status_code == 302
    states = client.session["oidc_states"]
    assert "abandoned" not in states
    assert "other_tab" in states and len(states) == 2  # and the login just started


def test_a_replayed_callback_is_refused(provider):
    """The state is used once: the same callback again (a reloaded page, a copied URL) is
    refused, and nothing is exchanged or recorded a second time."""
    from sso.views import LOGIN_EXPIRED

    client, first = log_in(provider, {"preferred_username": "rita", "sub": "s-rita"})
    assert first.status_code == 302
    assert "oidc_states" in client.session  # the login's state is out of it, not the dict
    replay = client.get("/sso/callback/?code=the-code&state=st")
    assert replay.status_code == 400
    assert escape(LOGIN_EXPIRED) in replay.content.decode()
    assert LoginRecord.objects.count() == 1


@pytest.fixture
def carol_from_the_provider(carol, vision_team):
    """carol, lead of vision and an admin, both through her groups (vision-leads,
    portal-admins), has logged in through the provider before (subject s-carol)."""
    GroupMapping.objects.create(group="vision-leads", team=vision_team, role="LEAD")
    GroupMapping.objects.create(group="portal-admins", role="ADMIN")
    carol.is_staff = carol.is_superuser = True
    carol.save()
    ProviderIdentity.objects.create(user=carol, issuer=ISSUER, subject="s-carol")
    return carol


def assert_refused_and_untouched(client, response, carol, reason: str) -> None:
    """The login ends on the login page with `reason`, recorded; carol is not logged in and
    keeps her team and her admin rights."""
    from shares.selectors import is_admin

    assert response.status_code == 403, response.status_code
    assert escape(reason) in response.content.decode()
    assert "_auth_user_id" not in client.session
    carol.refresh_from_db()
    assert is_admin(carol)
    assert list(carol.memberships.values_list("team__slug", "role")) == [("vision", "LEAD")]
    record = LoginRecord.objects.get()
    assert (record.outcome, record.reason) == (LoginRecord.Outcome.REFUSED, reason)
    assert record.username == "carol" and record.subject == "s-carol"


@pytest.mark.parametrize(
    "overage",
    [
        {
            "_claim_names": {"groups": "src1"},
            "_claim_sources": {
                "src1": {"endpoint": "https://graph.windows.net/TENANT/users/OID/getMemberObjects"}
            },
        },
        {"hasgroups": True},
    ],
    ids=["claim_names", "hasgroups"],
)
def test_a_group_overage_refuses_the_login_and_keeps_teams_and_admin_rights(
    provider, carol_from_the_provider, overage, caplog
):
    """Microsoft Entra ID sends, for a person in more than 200 groups, no `groups` claim but a
    pointer to fetch them (`_claim_names`/`_claim_sources`; `hasgroups` in the implicit flow).
    The portal read that as no groups: carol's login ended her lead role and her admin rights.
    The login is refused, naming the cause and the fix, and logged; nothing of hers changes."""
    from sso.backends import GROUPS_ELSEWHERE

    client, response = log_in(
        provider, {"preferred_username": "carol", "sub": "s-carol", **overage}
    )
    reason = GROUPS_ELSEWHERE.format(claim="groups")
    assert_refused_and_untouched(client, response, carol_from_the_provider, reason)
    assert any(reason in record.getMessage() for record in caplog.records)


def test_an_overage_of_a_claim_the_portal_does_not_read_changes_nothing(
    provider, carol_from_the_provider, settings
):
    """With OIDC_GROUPS_CLAIM=roles (Entra's app roles), a `groups` overage is no concern:
    carol logs in with her roles."""
    settings.OIDC_GROUPS_CLAIM = "roles"
    _, response = log_in(
        provider,
        {
            "preferred_username": "carol",
            "sub": "s-carol",
            "roles": ["vision-leads", "portal-admins"],
            "_claim_names": {"groups": "src1"},
            "_claim_sources": {"src1": {"endpoint": "https://graph.example/groups"}},
        },
    )
    assert response.status_code == 302
    record = LoginRecord.objects.get()
    assert record.outcome == LoginRecord.Outcome.LOGGED_IN and record.changes == []


@pytest.mark.parametrize(
    ("groups", "message", "shown"),
    [
        (None, "GROUPS_NOT_A_LIST", "null"),
        ("", "GROUPS_NOT_A_LIST", '""'),
        (
            [{"id": "g-1", "displayName": "vision-leads"}],
            "GROUP_NOT_A_NAME",
            '{"id": "g-1", "displayName": "vision-leads"}',
        ),
        (["vision-leads", None], "GROUP_NOT_A_NAME", "null"),
        (["portal-admins", 7], "GROUP_NOT_A_NAME", "7"),
    ],
    ids=["null", "empty-string", "list-of-objects", "list-with-null", "list-with-number"],
)
def test_a_groups_claim_that_is_not_group_names_is_refused_and_strips_nothing(
    provider, carol_from_the_provider, groups, message, shown
):
    """A groups claim that is present but not a list of group names (null, an empty string, a
    list of group objects as a mapper misconfigured sends them) was read as no groups, or as
    groups named '{'id': ...}' that no mapping names: either way carol lost her team and her
    admin rights. The login is refused with a message naming the claim and what it held."""
    from sso import backends

    client, response = log_in(
        provider, {"preferred_username": "carol", "sub": "s-carol", "groups": groups}
    )
    template = getattr(backends, message)
    reason = template.format(claim="groups", value=shown, item=shown)
    assert_refused_and_untouched(client, response, carol_from_the_provider, reason)
    assert shown in reason


def test_a_groups_claim_of_one_string_is_one_group(provider, carol_from_the_provider):
    """docs/sso.md: the claim may be one string (Google's `hd`, ADFS for a person in one
    group): that is one group, not a refusal."""
    _, response = log_in(
        provider, {"preferred_username": "carol", "sub": "s-carol", "groups": "vision-leads"}
    )
    assert response.status_code == 302
    record = LoginRecord.objects.get()
    assert record.groups == ["vision-leads"] and record.changes == ["no longer an admin"]
