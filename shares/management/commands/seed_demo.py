"""Demo data for a first look: an admin, three teams with leads and members, one share of each
strategy, and a few nodes of two GPU types. Running it again changes nothing."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from scheduler.models import Node
from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create

TEAMS = [
    ("ML Research", "ml-research", "Large training runs; borrows whatever is idle."),
    ("Vision", "vision", "Vision models; lends its idle H100s."),
    ("Inference", "inference", "Online serving; keeps its L4s to itself."),
]
USERS = [  # username, team slug, role
    ("alice", "ml-research", Membership.Role.LEAD),
    ("bob", "ml-research", Membership.Role.MEMBER),
    ("carol", "vision", Membership.Role.LEAD),
    ("dave", "inference", Membership.Role.LEAD),
]
SHARES = [  # name, team slug, limits, strategy, extra settings
    (
        "research",
        "ml-research",
        {"h100": 8, "l4": 2},
        QuotaShare.Strategy.LEND_AND_BORROW,
        {"borrow_limit": 100, "grace_seconds": 10},
    ),
    ("vision", "vision", {"h100": 8}, QuotaShare.Strategy.LEND, {"grace_seconds": 10}),
    ("inference", "inference", {"l4": 4}, QuotaShare.Strategy.RESERVE, {"grace_seconds": 10}),
]
NODES = [("node-h100-0", "h100", 8), ("node-h100-1", "h100", 8),
         ("node-l4-0", "l4", 4), ("node-l4-1", "l4", 4)]  # fmt: skip


class Command(BaseCommand):
    help = "Create demo teams, shares, nodes and an admin user (idempotent)."

    @transaction.atomic
    def handle(self, *args, **options) -> None:
        password = self._admin_password()
        User = get_user_model()
        admin, created = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            admin.set_password(password)
            admin.save()
        teams = {}
        for name, slug, description in TEAMS:
            teams[slug], _ = Team.objects.get_or_create(
                slug=slug, defaults={"name": name, "description": description}
            )
        for username, slug, role in USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.save()
            Membership.objects.get_or_create(team=teams[slug], user=user, defaults={"role": role})
        for name, slug, limits, strategy, extra in SHARES:
            if not QuotaShare.objects.filter(name=name).exists():
                share_create(
                    name=name,
                    team=teams[slug],
                    capacity_limits=limits,
                    strategy=strategy,
                    actor=admin,
                    source=ShareChange.Source.COMMAND,
                    **extra,
                )
        for name, gpu_type, gpus in NODES:
            Node.objects.get_or_create(name=name, defaults={"gpu_type": gpu_type, "gpus": gpus})
        self.stdout.write(
            f"Demo data ready. Log in to the admin as admin / {password}\n"
            f"Team users {', '.join(u for u, *_ in USERS)} share that password "
            f"(saved in {self._password_file()}): at /dash/ leads "
            f"({', '.join(u for u, _, role in USERS if role == Membership.Role.LEAD)}) see the "
            f"dashboards and members "
            f"({', '.join(u for u, _, role in USERS if role == Membership.Role.MEMBER)}) "
            f"their own jobs."
        )

    def _password_file(self):
        return settings.VAR_DIR / "demo-password.txt"

    def _admin_password(self) -> str:
        """The demo password: made once, kept under var/ so every run prints the same one."""
        path = self._password_file()
        if path.exists():
            return path.read_text().strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(12)
        path.write_text(password + "\n")
        path.chmod(0o600)
        return password
