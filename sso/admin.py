from __future__ import annotations

from django.contrib import admin

from shares.admin import KeyAutocompleteMixin
from sso.models import GroupMapping, LoginRecord, ProviderIdentity


@admin.register(GroupMapping)
class GroupMappingAdmin(admin.ModelAdmin):
    """The table that turns the provider's groups into teams and roles at each login."""

    list_display = ["group", "role", "team"]
    list_filter = ["role", "team"]
    search_fields = ["group", "team__name"]
    list_select_related = ["team"]


@admin.register(ProviderIdentity)
class ProviderIdentityAdmin(KeyAutocompleteMixin, admin.ModelAdmin):
    """Adding one links an existing local account to the provider's subject (a refused login's
    record names the subject)."""

    list_display = ["user", "subject", "issuer", "created_at"]
    search_fields = ["user__username", "subject"]
    autocomplete_fields = ["user"]


@admin.register(LoginRecord)
class LoginRecordAdmin(admin.ModelAdmin):
    """Every login through the provider: what its groups applied, or why it was refused.
    Read-only: a record is evidence."""

    list_display = ["at", "username", "outcome", "groups", "memberships", "admin", "changes"]
    list_filter = ["outcome", "admin"]
    search_fields = ["username", "subject"]
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
