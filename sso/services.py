"""The writes of a login through the provider: the user it is, what their groups make them,
and its record."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.contrib.auth import get_user_model
from django.db import transaction

from shares.models import Membership, Team
from shares.selectors import is_admin
from sso.models import GroupMapping, LoginRecord, ProviderIdentity

# Messages that tests assert (shown on the login error page and kept in the LoginRecord).
USERNAME_TAKEN = (
    "The portal already has a local account named {username!r} that is not linked to this "
    "identity provider. An admin links it (Single sign-on → Provider identities: the user, "
    "issuer {issuer}, subject {subject}) or renames it."
)
ACCOUNT_DISABLED = "The portal account {username!r} is disabled; ask an admin."
USERNAME_TOO_LONG = (
    "The identity provider names this person with {length} characters; a portal username has "
    "at most {limit}: see OIDC_USERNAME_CLAIM in docs/sso.md."
)
SUBJECT_TOO_LONG = (
    "The identity provider's subject for this person has {length} characters; OpenID Connect "
    "allows at most {limit}."
)

_ROLE_RANK = {str(Membership.Role.MEMBER.value): 1, str(Membership.Role.LEAD.value): 2}


class LoginRefused(Exception):
    """A login through the provider that the portal does not accept; the message says why, to
    the person and in the LoginRecord."""

    def __init__(self, reason: str, *, claims: Mapping | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.claims = dict(claims or {})


def identity_user(*, issuer: str, subject: str):
    """The portal user behind (issuer, subject), or None for someone who never logged in."""
    identity = ProviderIdentity.objects.select_related("user").filter(
        issuer=issuer, subject=subject
    )
    return identity[0].user if identity else None


def identity_create_user(*, issuer: str, subject: str, username: str, email: object, name: object):
    """A new portal user for someone's first login, without a local password. The username is
    Django's normalised form (NFKC) of the provider's; a name that is too long, or an existing
    account's, refuses the login. `email` and `name` are the claims as the provider sent them."""
    User = get_user_model()
    username = User.normalize_username(username)
    if len(username) > _max_length(User, "username"):
        limit = _max_length(User, "username")
        raise LoginRefused(USERNAME_TOO_LONG.format(length=len(username), limit=limit))
    if len(subject) > _max_length(ProviderIdentity, "subject"):
        limit = _max_length(ProviderIdentity, "subject")
        raise LoginRefused(SUBJECT_TOO_LONG.format(length=len(subject), limit=limit))
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise LoginRefused(
                USERNAME_TAKEN.format(username=username, issuer=issuer, subject=subject)
            )
        user = User.objects.create_user(
            username, **profile_of(email=email, name=name)
        )  # no password: create_user leaves an unusable one
        ProviderIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    return user


def profile_of(*, email: object, name: object) -> dict[str, str]:
    """The email and names a new user gets from the provider's claims: only strings; an email
    too long for its column is left out (cut, it would be another address), names are cut."""
    User = get_user_model()
    if not isinstance(email, str) or len(email) > _max_length(User, "email"):
        email = ""
    first, _, last = (name if isinstance(name, str) else "").partition(" ")
    return {
        "email": email,
        "first_name": first[: _max_length(User, "first_name")],
        "last_name": last[: _max_length(User, "last_name")],
    }


def _max_length(model, field: str) -> int:
    return model._meta.get_field(field).max_length


def mapped_roles(groups: Iterable[str]) -> tuple[dict[int, str], bool]:
    """What the groups make someone: {team id: role} (lead over member when two groups name
    the same team) and whether an admin."""
    teams: dict[int, str] = {}
    admin = False
    for mapping in GroupMapping.objects.filter(group__in=list(groups)):
        if mapping.role == GroupMapping.Role.ADMIN:
            admin = True
        elif _ROLE_RANK[mapping.role] > _ROLE_RANK.get(teams.get(mapping.team_id), 0):
            teams[mapping.team_id] = mapping.role
    return teams, admin


def login_apply_groups(*, user, groups: list[str], subject: str) -> LoginRecord:
    """Applies the group mapping to `user` at a login and records what it did. The teams some
    mapping names get exactly the memberships the groups map to (others are left as they are);
    admin rights follow the groups while any admin mapping exists."""
    with transaction.atomic():
        wanted, admin = mapped_roles(groups)
        managed = set(GroupMapping.objects.exclude(team=None).values_list("team_id", flat=True))
        teams = Team.objects.in_bulk(managed)
        changes: list[str] = []
        held = {m.team_id: m for m in Membership.objects.filter(user=user, team_id__in=managed)}
        for team_id in sorted(managed, key=lambda pk: teams[pk].slug):
            team, membership, role = teams[team_id], held.get(team_id), wanted.get(team_id)
            if membership is not None and role is None:
                membership.delete()
                changes.append(f"left {team.slug}")
            elif membership is None and role is not None:
                Membership.objects.create(team=team, user=user, role=role)
                changes.append(f"joined {team.slug} as {role.lower()}")
            elif membership is not None and membership.role != role:
                changes.append(f"{team.slug}: {membership.role.lower()} → {role.lower()}")
                membership.role = role
                membership.save(update_fields=["role"])
        admin_mapped = GroupMapping.objects.filter(role=GroupMapping.Role.ADMIN).exists()
        # An admin mapping makes staff and superuser; without it, staff or superuser is still
        # an admin (shares.selectors.is_admin), so both end together.
        if admin_mapped and (user.is_staff, user.is_superuser) != (admin, admin):
            changes.append("became an admin" if admin else "no longer an admin")
            user.is_staff = user.is_superuser = admin
            user.save(update_fields=["is_staff", "is_superuser"])
        memberships = dict(
            Membership.objects.filter(user=user)
            .order_by("team__slug")
            .values_list("team__slug", "role")
        )
        return LoginRecord.objects.create(
            outcome=LoginRecord.Outcome.LOGGED_IN,
            user=user,
            username=user.get_username(),
            subject=subject,
            groups=groups,
            memberships=memberships,
            admin=is_admin(user),
            changes=changes,
        )


def login_record_refusal(*, reason: str, username: str = "", subject: str = "", groups=()):
    """Records a login the portal refused, with why; a name or subject too long for the record
    is kept cut."""
    username = username[: _max_length(LoginRecord, "username")]
    subject = subject[: _max_length(LoginRecord, "subject")]
    User = get_user_model()
    user = (
        User.objects.filter(username=User.normalize_username(username)).first()
        if username
        else None
    )
    return LoginRecord.objects.create(
        outcome=LoginRecord.Outcome.REFUSED,
        user=user,
        username=username,
        subject=subject,
        reason=reason,
        groups=list(groups),
    )
