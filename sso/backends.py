"""The two ways to log in: a local password (as PASSWORD_LOGIN allows) and the identity
provider (mozilla-django-oidc's backend, with the checks and the mapping of this portal)."""

from __future__ import annotations

import json

import jwt
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from sso.conf import SIGN_ALGO_UNSUPPORTED, SIGN_ALGOS_SUPPORTED
from sso.services import (
    ACCOUNT_DISABLED,
    LoginRefused,
    identity_create_user,
    identity_user,
    login_apply_groups,
)

# Messages that tests assert (shown on the login error page and kept in the LoginRecord).
WRONG_ISSUER = (
    "The ID token was issued by {issuer!r}, not by the identity provider the portal trusts "
    "({expected!r})."
)
EXPIRED_TOKEN = "The ID token has expired: log in again (if it keeps happening, check the clocks)."
BAD_SIGNATURE = "The ID token's signature is not the identity provider's: it was altered."
INVALID_TOKEN = "The identity provider's ID token is not valid: {error}."
NOT_FOR_US = "The ID token was issued for another application (audience {audience!r})."
REQUESTED_BY_ANOTHER = "The ID token was requested by another application (azp {azp!r})."
CLAIM_MISSING = (
    "The identity provider sent no {claim!r} claim: see OIDC_USERNAME_CLAIM in docs/sso.md."
)
SUBJECT_MISMATCH = "The provider's userinfo describes another subject than its ID token."
GROUPS_NOT_A_LIST = (
    "The identity provider's {claim!r} claim is {value:.80}, neither a list of group names nor "
    "one group name: see OIDC_GROUPS_CLAIM in docs/sso.md."
)
GROUP_NOT_A_NAME = (
    "The identity provider's {claim!r} claim holds {item:.80}, which is not a group name (a "
    "string): see OIDC_GROUPS_CLAIM in docs/sso.md."
)
GROUPS_ELSEWHERE = (
    "The identity provider sent no {claim!r} claim, only a pointer to fetch it from elsewhere: "
    "Microsoft Entra ID does this for a person in more than 200 groups (group overage). The "
    "portal does not take that as no groups, which would end their teams and admin rights, so "
    "the login is refused. Ask the portal's admin: the provider must send only the groups "
    "assigned to the application (or app roles, with OIDC_GROUPS_CLAIM=roles), or "
    "OIDC_GROUPS_CLAIM must name a claim the provider sends: see docs/sso.md."
)
# A few seconds of clock difference between the provider and the portal are no error.
CLOCK_LEEWAY_SECONDS = 30


def password_login_allowed(user) -> bool:
    """Whether `user` may log in with a local password, as PASSWORD_LOGIN says."""
    return settings.PASSWORD_LOGIN == "all" or (
        settings.PASSWORD_LOGIN == "admins" and user.is_superuser
    )


class PasswordBackend(ModelBackend):
    """Django's username and password, for whom PASSWORD_LOGIN lets in; with single sign-on on
    that is the break-glass admin. Permissions of everyone still come from here."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and not password_login_allowed(user):
            return None
        return user


class ProviderBackend(OIDCAuthenticationBackend):
    """The identity provider's login (authorization code flow with PKCE): the ID token must
    carry the provider's signature, the configured issuer, this client as audience and an
    expiry still ahead; the person is matched on (issuer, subject) and their groups are
    applied through the GroupMapping table. Anything wrong raises LoginRefused, which the
    callback view shows."""

    def authenticate(self, request, **kwargs):
        # Only the callback view asks (with the nonce it kept), and only when single sign-on is on.
        if not settings.OIDC_ENABLED or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        if self.OIDC_RP_SIGN_ALGO not in SIGN_ALGOS_SUPPORTED:
            raise LoginRefused(SIGN_ALGO_UNSUPPORTED.format(algo=self.OIDC_RP_SIGN_ALGO))
        try:
            return super().verify_token(token, **kwargs)
        except (jwt.PyJWTError, KeyError) as error:  # not a JWT, no key id, a key of another type
            raise LoginRefused(INVALID_TOKEN.format(error=repr(error))) from None
        except SuspiciousOperation as error:  # no key of the provider's JWKS, a wrong nonce
            raise LoginRefused(INVALID_TOKEN.format(error=error)) from None

    def _verify_jws(self, payload, key):
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise LoginRefused(INVALID_TOKEN.format(error=f"signed with {header.get('alg')!r}"))
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.OIDC_OP_ISSUER,
                leeway=CLOCK_LEEWAY_SECONDS,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.InvalidIssuerError:
            issuer = jwt.decode(payload, options={"verify_signature": False}).get("iss")
            raise LoginRefused(
                WRONG_ISSUER.format(issuer=issuer, expected=settings.OIDC_OP_ISSUER)
            ) from None
        except jwt.ExpiredSignatureError:
            raise LoginRefused(EXPIRED_TOKEN) from None
        except jwt.InvalidSignatureError:
            raise LoginRefused(BAD_SIGNATURE) from None
        except jwt.InvalidAudienceError:
            audience = jwt.decode(payload, options={"verify_signature": False}).get("aud")
            raise LoginRefused(NOT_FOR_US.format(audience=audience)) from None
        except jwt.InvalidTokenError as error:
            raise LoginRefused(INVALID_TOKEN.format(error=error)) from None
        self._verify_audience(claims)
        return claims

    def _verify_audience(self, claims) -> None:
        """OpenID Connect Core 1.0 §3.1.3.7, items 3 to 5 (PyJWT has checked that the client is
        among the audiences): no other audience, which this portal does not trust, and an
        authorized party (azp), when present, that is this client."""
        audience = claims["aud"]
        if isinstance(audience, list) and any(a != self.OIDC_RP_CLIENT_ID for a in audience):
            raise LoginRefused(NOT_FOR_US.format(audience=audience))
        if "azp" in claims and claims["azp"] != self.OIDC_RP_CLIENT_ID:
            raise LoginRefused(REQUESTED_BY_ANOTHER.format(azp=claims["azp"]))

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims, with the userinfo endpoint's on top when one is configured."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            userinfo = super().get_userinfo(access_token, id_token, payload)
            if userinfo.get("sub") != payload["sub"]:
                raise LoginRefused(SUBJECT_MISMATCH)
            claims.update(userinfo)
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        username = claims.get(settings.OIDC_USERNAME_CLAIM)
        if not username:
            raise LoginRefused(
                CLAIM_MISSING.format(claim=settings.OIDC_USERNAME_CLAIM), claims=claims
            )
        groups = groups_of(claims)
        issuer, subject = payload["iss"], payload["sub"]
        try:
            user = identity_user(issuer=issuer, subject=subject) or identity_create_user(
                issuer=issuer,
                subject=subject,
                username=str(username),
                email=claims.get("email"),
                name=claims.get("name"),
            )
        except LoginRefused as refused:
            refused.claims = claims
            raise
        if not user.is_active:
            raise LoginRefused(ACCOUNT_DISABLED.format(username=user.username), claims=claims)
        login_apply_groups(user=user, groups=groups, subject=subject)
        return user


def groups_of(claims) -> list[str]:
    """The values of the groups claim: a list of strings, or one string (one group); none when
    the claim is absent or an empty list. The login is refused, rather than taken as having no
    groups (which would end every mapped membership and admin rights), when the provider says
    the groups are to be fetched elsewhere (group overage), or when the claim is anything else:
    null, an empty string, a number, a list holding something other than strings."""
    claim = settings.OIDC_GROUPS_CLAIM
    if claim not in claims:
        if groups_sent_elsewhere(claims, claim):
            raise LoginRefused(GROUPS_ELSEWHERE.format(claim=claim), claims=claims)
        return []
    groups = claims[claim]
    if isinstance(groups, str) and groups:
        return [groups]
    if not isinstance(groups, list):
        value = json.dumps(groups, default=str)
        raise LoginRefused(GROUPS_NOT_A_LIST.format(claim=claim, value=value), claims=claims)
    for group in groups:
        if not isinstance(group, str):
            item = json.dumps(group, default=str)
            raise LoginRefused(GROUP_NOT_A_NAME.format(claim=claim, item=item), claims=claims)
    return groups


def groups_sent_elsewhere(claims, claim: str) -> bool:
    """Whether the claims point elsewhere for `claim` instead of carrying it: a distributed or
    aggregated claim (OpenID Connect Core 1.0 §5.6.2: `_claim_names` names it, as Entra ID's
    group overage does), or Entra ID's `hasgroups: true` in place of `groups`."""
    names = claims.get("_claim_names")
    if isinstance(names, dict) and claim in names:
        return True
    return claim == "groups" and claims.get("hasgroups") is True


def groups_to_record(claims) -> list[str]:
    """The groups a refused login's record keeps: groups_of's, or none when the groups claim is
    what was refused."""
    try:
        return groups_of(claims)
    except LoginRefused:
        return []
