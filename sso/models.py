"""Who the identity provider says someone is, what their groups make them in the portal, and
a record of every login through it."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from shares.models import Team

# Messages that tests assert.
TEAM_REQUIRED = "team: a member or lead mapping names the team the group joins."
TEAM_NOT_FOR_ADMIN = "team: an admin mapping makes portal admins; it names no team."


class GroupMapping(models.Model):
    """A value of the groups claim → a role on a team, or admin. Applied at each login: the
    teams that some mapping names get exactly the memberships the person's groups map to, and
    when any admin mapping exists, being an admin follows it too. Teams no mapping names, and
    admin rights while no admin mapping exists, are left as the admin set them by hand."""

    class Role(models.TextChoices):
        MEMBER = "MEMBER", "Member of the team"
        LEAD = "LEAD", "Lead of the team"
        ADMIN = "ADMIN", "Portal admin (staff and superuser)"

    group = models.CharField(
        max_length=255,
        help_text="A value of the groups claim, exactly as the provider sends it (Entra ID: "
        "the group's object ID).",
    )
    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, null=True, blank=True, related_name="group_mappings"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["group", "team__name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(role="ADMIN", team__isnull=True)
                | (~Q(role="ADMIN") & Q(team__isnull=False)),
                name="group_mapping_team_unless_admin",
            ),
            models.UniqueConstraint(fields=["group", "team"], name="group_mapping_once_per_team"),
            models.UniqueConstraint(
                fields=["group"], condition=Q(role="ADMIN"), name="group_mapping_admin_once"
            ),
        ]

    def __str__(self) -> str:
        if self.role == self.Role.ADMIN:
            return f"{self.group} → admin"
        return f"{self.group} → {self.role.lower()} of {self.team}"

    def clean(self) -> None:
        if self.role == self.Role.ADMIN and self.team_id is not None:
            raise ValidationError({"team": TEAM_NOT_FOR_ADMIN})
        if self.role != self.Role.ADMIN and self.team_id is None:
            raise ValidationError({"team": TEAM_REQUIRED})


class ProviderIdentity(models.Model):
    """The provider's subject behind a portal user: a login is matched on (issuer, subject),
    never on a name or an email the provider lets people change. An admin adds one by hand to
    let an existing local account log in through the provider."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "provider identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="identity_once_per_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} = {self.subject} at {self.issuer}"


class LoginRecord(models.Model):
    """One login through the provider: the groups it sent, and what the mapping made of them;
    or why the login was refused."""

    class Outcome(models.TextChoices):
        LOGGED_IN = "LOGGED_IN", "Logged in"
        REFUSED = "REFUSED", "Refused"

    # The admin's list of logins, newest first.
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="login_records",
    )
    username = models.CharField(max_length=255, blank=True, help_text="As the provider named them.")
    subject = models.CharField(max_length=255, blank=True)
    reason = models.TextField(blank=True, help_text="Why the login was refused.")
    groups = models.JSONField(default=list, blank=True, help_text="The groups claim's values.")
    memberships = models.JSONField(
        default=dict, blank=True, help_text="After the login: team slug → role."
    )
    admin = models.BooleanField(default=False, help_text="An admin after the login.")
    changes = models.JSONField(
        default=list, blank=True, help_text="What this login changed, one line each."
    )

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        outcome = self.get_outcome_display().lower()
        return f"{self.username or '?'} {outcome} at {self.at:%Y-%m-%d %H:%M}"
