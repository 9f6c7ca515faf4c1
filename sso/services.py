"""The writes of a login through the provider: the user it is, what their groups make them,
and its record."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.contrib.auth import get_user_model
from django.db import transaction

from shares.models import Membership, Team
from sso.models import GroupMapping, LoginRecord, ProviderIdentity

# Messages that tests assert (shown on the login error page and kept in the LoginRecord).
USERNAME_TAKEN = (
    "The portal already has a local account named {username!r} that is not linked to this "
    "identity provider. An admin links it (Single sign-on → Provider identities: the user, "
    "issuer {issuer}, subject {subject}) or renames it."
)
ACCOUNT_DISABLED = "The portal account {username!r} is disabled; ask an admin."

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


def identity_create_user(*, issuer: str, subject: str, username: str, email: str, name: str):
    """A new portal user for someone's first login, without a local password."""
    User = get_user_model()
    with transaction.atomic():
        if User.objects.filter(username=username).exists():
            raise LoginRefused(
                USERNAME_TAKEN.format(username=username, issuer=issuer, subject=subject)
            )
        first, _, last = name.partition(" ")
        user = User.objects.create_user(
            username, email=email, first_name=first[:150], last_name=last[:150]
        )  # no password: create_user leaves an unusable one
        ProviderIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    return user


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
        if admin_mapped and admin != (user.is_staff and user.is_superuser):
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
            admin=user.is_superuser,
            changes=changes,
        )


def login_record_refusal(*, reason: str, username: str = "", subject: str = "", groups=()):
    """Records a login the portal refused, with why."""
    user = get_user_model().objects.filter(username=username).first() if username else None
    return LoginRecord.objects.create(
        outcome=LoginRecord.Outcome.REFUSED,
        user=user,
        username=username,
        subject=subject,
        reason=reason,
        groups=list(groups),
    )
