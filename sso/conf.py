"""Settings of single sign-on with OpenID Connect, read from the environment (docs/sso.md).

portal/settings.py star-imports this module, so each name here is a Django setting. The names
that begin OIDC_OP_ / OIDC_RP_ are mozilla-django-oidc's own. Off by default: the zero-setup
system logs in with local passwords. Numbers and yes/no settings are read with portal/env.py's
readers: a malformed value stops the portal at start, naming the variable and its rule."""

import environ
from django.core.exceptions import ImproperlyConfigured

from portal.env import flag, seconds

_env = environ.Env()

OIDC_ENABLED = flag("OIDC_ENABLED", default=False)
# What the login button says: "Log in with {OIDC_PROVIDER_NAME}".
OIDC_PROVIDER_NAME = _env.str("OIDC_PROVIDER_NAME", default="single sign-on")
# The ID token's `iss` must be exactly this (mozilla-django-oidc checks the signature, we check
# the issuer, the audience and the expiry).
OIDC_OP_ISSUER = _env.str("OIDC_OP_ISSUER", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = _env.str("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = _env.str("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = _env.str("OIDC_OP_JWKS_ENDPOINT", default="")
# Optional: its claims are added to the ID token's (providers that send groups only there).
OIDC_OP_USER_ENDPOINT = _env.str("OIDC_OP_USER_ENDPOINT", default="")
# Optional: the provider's end_session_endpoint. Set, logging out of the portal after a login
# through the provider ends the session there too (RP-initiated logout), so the next login asks
# for the password again. The ID token is kept in the (server-side) session as its hint.
OIDC_OP_LOGOUT_ENDPOINT = _env.str("OIDC_OP_LOGOUT_ENDPOINT", default="")
OIDC_STORE_ID_TOKEN = True
OIDC_RP_CLIENT_ID = _env.str("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = _env.str("OIDC_RP_CLIENT_SECRET", default="")
OIDC_RP_SIGN_ALGO = _env.str("OIDC_RP_SIGN_ALGO", default="RS256")
# mozilla-django-oidc picks the key by the algorithm's first letters: RS* and ES* are checked
# with the provider's JWKS, anything else with the client secret (as HS* must be). PS256 or
# EdDSA would be checked with the secret and never pass, so they are refused (here at start,
# and by ProviderBackend for a setting changed later).
SIGN_ALGOS_SUPPORTED = (
    *("RS256", "RS384", "RS512"),
    *("ES256", "ES384", "ES512"),
    *("HS256", "HS384", "HS512"),
)
SIGN_ALGO_UNSUPPORTED = (
    "OIDC_RP_SIGN_ALGO is {algo!r}, which mozilla-django-oidc cannot check; the portal takes "
    "RS256, RS384, RS512, ES256, ES384, ES512 (the provider's JWKS) or HS256, HS384, HS512 "
    "(the client secret): see docs/sso.md."
)
if OIDC_RP_SIGN_ALGO not in SIGN_ALGOS_SUPPORTED:
    raise ImproperlyConfigured(SIGN_ALGO_UNSUPPORTED.format(algo=OIDC_RP_SIGN_ALGO))
OIDC_RP_SCOPES = _env.str("OIDC_RP_SCOPES", default="openid email profile")
# The client authenticates to the token endpoint with HTTP Basic (client_secret_basic) rather
# than in the form body (client_secret_post).
OIDC_TOKEN_USE_BASIC_AUTH = flag("OIDC_TOKEN_USE_BASIC_AUTH", default=False)
# The claim that lists a person's groups (a list of strings, or one string; a claim of another
# shape, or one the provider left out to be fetched elsewhere, refuses the login: groups_of in
# sso/backends.py), and the one that names their portal user.
OIDC_GROUPS_CLAIM = _env.str("OIDC_GROUPS_CLAIM", default="groups")
OIDC_USERNAME_CLAIM = _env.str("OIDC_USERNAME_CLAIM", default="preferred_username")
# Seconds the portal waits for the provider (its keys, its token endpoint) before it shows the
# "provider not answering" page.
OIDC_TIMEOUT = seconds("OIDC_TIMEOUT", default=5.0)
# A login started at /sso/login/ must come back from the provider within this many seconds: its
# state, nonce and PKCE verifier (kept in the session) are refused after that ("this login link
# has expired, start it again"), and dropped from the session at the next login that starts.
OIDC_STATE_LIFETIME_SECONDS = seconds("OIDC_STATE_LIFETIME_SECONDS", default=600.0)
# Authorization code flow with PKCE (S256), always.
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_AUTHENTICATION_CALLBACK_URL = "sso:callback"

# Who may still log in with a local password: `all` (the default without single sign-on),
# `admins` (the default with it: superusers only, the break-glass account), or `none`.
PASSWORD_LOGIN = _env.str("PASSWORD_LOGIN", default="admins" if OIDC_ENABLED else "all")
if PASSWORD_LOGIN not in ("all", "admins", "none"):
    raise ImproperlyConfigured(
        f"PASSWORD_LOGIN: 'all', 'admins' or 'none', not {PASSWORD_LOGIN!r}."
    )

OIDC_REQUIRED = (
    "OIDC_OP_ISSUER",
    "OIDC_OP_AUTHORIZATION_ENDPOINT",
    "OIDC_OP_TOKEN_ENDPOINT",
    "OIDC_OP_JWKS_ENDPOINT",
    "OIDC_RP_CLIENT_ID",
    "OIDC_RP_CLIENT_SECRET",
)
if OIDC_ENABLED and (_missing := [name for name in OIDC_REQUIRED if not globals()[name]]):
    raise ImproperlyConfigured(
        f"OIDC_ENABLED is on but {', '.join(_missing)} not set: see docs/sso.md."
    )

# Local passwords (as PASSWORD_LOGIN allows), then the identity provider; the second answers
# only the provider's callback, and only when OIDC_ENABLED is on.
AUTHENTICATION_BACKENDS = ["sso.backends.PasswordBackend", "sso.backends.ProviderBackend"]
