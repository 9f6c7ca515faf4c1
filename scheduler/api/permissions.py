"""Who may do what (issue #5):

- admins (is_staff or superuser): everything;
- a team lead: sees every job of the team's shares and manages them (cancel, priority);
- a member: submits to the team's shares, sees the team's jobs, cancels their own;
- anyone else: 404 for another team's job or share — never its data.

Reads are scoped by the selectors (`jobs_visible_to`, `shares_visible_to`), so what a user may
not see is simply not found. These checks decide what a user who *can* see an object may do
with it; a refusal there is a 403."""

from __future__ import annotations

from rest_framework import permissions
from rest_framework.exceptions import PermissionDenied

from scheduler.jobs.selectors import (
    CANCEL_REFUSED,
    PRIORITY_REFUSED,
    may_cancel,
    may_change_priority,
)
from scheduler.models import Job
from shares.selectors import is_admin

ADMIN_ONLY = "only admins may {action}."


class IsAdmin(permissions.BasePermission):
    message = ADMIN_ONLY.format(action="do this")

    def has_permission(self, request, view) -> bool:
        return is_admin(request.user)


def require_admin(user, action: str) -> None:
    if not is_admin(user):
        raise PermissionDenied(ADMIN_ONLY.format(action=action))


def require_can_update_job(user, job: Job) -> None:
    if may_change_priority(user, job):
        return
    raise PermissionDenied(PRIORITY_REFUSED.format(team=job.share.team.slug))


def require_can_cancel_job(user, job: Job) -> None:
    if may_cancel(user, job):
        return
    raise PermissionDenied(CANCEL_REFUSED.format(team=job.share.team.slug))
