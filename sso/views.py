"""The login's two steps with the provider, and the page that says why a login failed: never a
500, whatever the provider does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping
from functools import wraps
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from sso.backends import groups_to_record
from sso.services import LoginRefused, login_record_refusal

logger = logging.getLogger(__name__)

# Messages that tests assert.
PROVIDER_DOWN = (
    "The identity provider ({provider}) is not answering, so nobody can log in through it "
    "right now. Try again in a few minutes; if it lasts, tell the team that runs it."
)
PROVIDER_ERROR = "The identity provider refused the login: {error}."
WRONG_PROVIDER = (
    "The login came back from {issuer!r}, not from the identity provider the portal trusts "
    "({expected!r})."
)
LOGIN_EXPIRED = (
    "This login was already used, took too long or was started in another browser window: "
    "start it again."
)
LOGIN_LINK_EXPIRED = (
    "This login link has expired: a login must come back from the identity provider within "
    "{lifetime} of starting it. Start it again."
)
# What a login puts in the session before Django's login: the ID token (logout's hint for the
# provider's end-session endpoint) and the page to go back to.
KEPT_ACROSS_LOGIN = ("oidc_id_token", "oidc_login_next")


def login_failed(request: HttpRequest, reason: str, *, status: int) -> HttpResponse:
    return render(
        request,
        "sso/login_failed.html",
        {"reason": reason, "provider_name": settings.OIDC_PROVIDER_NAME},
        status=status,
    )


def _provider_down(request: HttpRequest, error: Exception) -> HttpResponse:
    logger.warning("identity provider not answering: %s", error)
    reason = PROVIDER_DOWN.format(provider=settings.OIDC_PROVIDER_NAME)
    login_record_refusal(reason=f"{reason} ({error.__class__.__name__})")
    return login_failed(request, reason, status=503)


def _oauth_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    return str(body.get("error_description") or body.get("error") or response.status_code)


def _lifetime() -> str:
    seconds = settings.OIDC_STATE_LIFETIME_SECONDS
    if seconds >= 60 and seconds % 60 == 0:
        minutes = int(seconds // 60)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} seconds"


def login_state_expired(entry: object, *, now: float) -> bool:
    """Whether a login's state (an entry of mozilla-django-oidc's `oidc_states` in the session:
    its nonce, PKCE verifier and `added_on`, the time the login started) is older than
    OIDC_STATE_LIFETIME_SECONDS; an entry without a readable start counts as expired."""
    try:
        added_on = float(entry["added_on"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return True
    return now - added_on > settings.OIDC_STATE_LIFETIME_SECONDS


def drop_expired_login_states(session: MutableMapping) -> None:
    """Removes the session's login states that have expired: logins started and never finished
    do not pile up in it (mozilla-django-oidc only caps them, at OIDC_MAX_STATES)."""
    states = session.get("oidc_states")
    if not isinstance(states, dict):
        return
    now = time.time()
    expired = [state for state, entry in states.items() if login_state_expired(entry, now=now)]
    for state in expired:
        del states[state]
    if expired:
        session["oidc_states"] = states  # marks the session modified


class LoginStart(OIDCAuthenticationRequestView):
    """Sends the browser to the provider (code flow with PKCE), after checking that the provider
    answers: otherwise the person would meet the browser's own error page on its host."""

    def dispatch(self, request, *args, **kwargs):
        if not settings.OIDC_ENABLED:
            raise Http404("single sign-on is off")
        return super().dispatch(request, *args, **kwargs)

    def get(self, request):
        drop_expired_login_states(request.session)
        try:
            requests.get(
                settings.OIDC_OP_JWKS_ENDPOINT, timeout=settings.OIDC_TIMEOUT
            ).raise_for_status()
        except requests.RequestException as error:
            return _provider_down(request, error)
        return super().get(request)


class LoginCallback(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: the code is exchanged for the tokens, the ID
    token checked, the groups applied; or a page says what went wrong. Each login's state is
    used once (mozilla-django-oidc takes it out of the session before the exchange, so a
    replayed callback is refused) and only within OIDC_STATE_LIFETIME_SECONDS of the start."""

    def dispatch(self, request, *args, **kwargs):
        if not settings.OIDC_ENABLED:
            raise Http404("single sign-on is off")
        # RFC 9207: a provider that names itself in the redirect must be the one we sent the
        # browser to (another provider's code must not reach our token endpoint).
        issuer = request.GET.get("iss")
        if issuer is not None and issuer != settings.OIDC_OP_ISSUER:
            reason = WRONG_PROVIDER.format(issuer=issuer, expected=settings.OIDC_OP_ISSUER)
            login_record_refusal(reason=reason)
            return login_failed(request, reason, status=403)
        states = request.session.get("oidc_states")
        state = request.GET.get("state")
        expired = (
            "code" in request.GET
            and isinstance(states, dict)
            and state in states
            and login_state_expired(states[state], now=time.time())
        )
        drop_expired_login_states(request.session)  # this one among them: it is never used
        if expired:
            reason = LOGIN_LINK_EXPIRED.format(lifetime=_lifetime())
            return login_failed(request, reason, status=400)
        try:
            return super().dispatch(request, *args, **kwargs)
        except LoginRefused as refused:
            username = str(refused.claims.get(settings.OIDC_USERNAME_CLAIM) or "")
            subject = str(refused.claims.get("sub") or "")
            # A provider misconfigured (a groups claim missing or malformed) refuses everyone
            # it touches: the operator sees it in the log, not only in the Login records.
            logger.warning(
                "login through the provider refused (username %r, subject %r): %s",
                username,
                subject,
                refused.reason,
            )
            login_record_refusal(
                reason=refused.reason,
                username=username,
                subject=subject,
                groups=groups_to_record(refused.claims),
            )
            return login_failed(request, refused.reason, status=403)
        except requests.HTTPError as error:
            if error.response is None or error.response.status_code >= 500:
                return _provider_down(request, error)
            # The token endpoint said no (a code already used, a PKCE verifier that fails).
            reason = PROVIDER_ERROR.format(error=_oauth_error(error.response))
            login_record_refusal(reason=reason)
            return login_failed(request, reason, status=403)
        except requests.RequestException as error:
            return _provider_down(request, error)
        except SuspiciousOperation as error:  # state or nonce not this browser's
            logger.warning("login callback refused: %s", error)
            return login_failed(request, LOGIN_EXPIRED, status=400)

    def login_success(self) -> HttpResponse:
        """Django's login, then back to the page the login started from. When this browser was
        logged in as someone else, auth.login empties the session for the new user: what this
        login kept there comes along into the new one."""
        session = self.request.session
        self.kept = {key: session[key] for key in KEPT_ACROSS_LOGIN if key in session}
        response = super().login_success()
        self.request.session.update(self.kept)
        return response

    @property
    def success_url(self) -> str:
        kept = getattr(self, "kept", self.request.session)  # login_success keeps it first
        return kept.get("oidc_login_next") or settings.LOGIN_REDIRECT_URL

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error_description") or self.request.GET.get("error")
        if error:
            login_record_refusal(reason=PROVIDER_ERROR.format(error=error))
            return login_failed(self.request, PROVIDER_ERROR.format(error=error), status=403)
        return login_failed(self.request, LOGIN_EXPIRED, status=400)


PROVIDER_BACKEND = "sso.backends.ProviderBackend"


def end_session_url(request: HttpRequest, *, login_page: str) -> str | None:
    """The provider's end-session endpoint for this session (RP-initiated logout), back to the
    portal's login page (a URL name) afterwards; None when OIDC_OP_LOGOUT_ENDPOINT is not set
    or the session is not a login through the provider (a local password logs out locally)."""
    id_token = request.session.get("oidc_id_token")
    from_provider = request.session.get(BACKEND_SESSION_KEY) == PROVIDER_BACKEND
    if not (settings.OIDC_ENABLED and settings.OIDC_OP_LOGOUT_ENDPOINT and from_provider):
        return None
    if not id_token:  # a session from before the ID token was kept
        return None
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse(login_page)),
            "client_id": settings.OIDC_RP_CLIENT_ID,
        }
    )
    return f"{settings.OIDC_OP_LOGOUT_ENDPOINT}?{query}"


def provider_logout(logout_view: Callable, *, login_page: str) -> Callable:
    """`logout_view` (Django's logout, of the admin or the dashboards), then on to the
    provider's end-session endpoint when end_session_url says so; otherwise its own response."""

    @wraps(logout_view)
    def view(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        end_session = end_session_url(request, login_page=login_page)  # before the session goes
        response = logout_view(request, *args, **kwargs)
        if end_session and request.method == "POST" and not request.user.is_authenticated:
            return HttpResponseRedirect(end_session)
        return response

    return view
