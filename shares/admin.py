from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.widgets import AutocompleteSelect
from django.core.exceptions import ValidationError
from django.db import connections, router
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from shares.models import (
    CAPACITY_LIMITS_COUNT,
    MAX_GPU_TYPES_PER_SHARE,
    CapacityLimit,
    Membership,
    QuotaShare,
    ShareChange,
    Team,
)
from shares.selectors import capacity_warnings
from shares.services import share_delete, share_record_changes, share_set_state, share_state


class KeyAutocompleteSelect(AutocompleteSelect):
    """An autocomplete select that looks up only what can be a key. A form shown again with
    its errors looks its posted value up to show it: a value that is no key (`abc`, `1.5`, a
    number beyond the database's integers) failed the page with a 500 instead of the field's
    "Select a valid choice"."""

    def optgroups(self, name, value, attr=None):
        return super().optgroups(name, [v for v in value if self._is_key(v)], attr)

    def _is_key(self, value) -> bool:
        target = self.field.target_field
        try:
            key = target.to_python(value)
        except ValidationError:
            return False
        if not isinstance(key, int):
            return True
        alias = self.db or router.db_for_read(target.model)
        low, high = connections[alias].ops.integer_field_range(target.get_internal_type())
        return (low is None or key >= low) and (high is None or key <= high)


class KeyAutocompleteMixin:
    """Use in place of `autocomplete_fields`' own widget (`KeyAutocompleteSelect`)."""

    def formfield_for_foreignkey(self, db_field, request: HttpRequest, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = KeyAutocompleteSelect(
                db_field, self.admin_site, using=kwargs.get("using")
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class MembershipInline(KeyAutocompleteMixin, admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "member_count"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    @admin.display(description="members")
    def member_count(self, team: Team) -> int:
        return team.memberships.count()


class CapacityLimitFormSet(BaseInlineFormSet):
    def clean(self) -> None:
        super().clean()
        kept = [
            form
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE", False)
        ]
        if not 1 <= len(kept) <= MAX_GPU_TYPES_PER_SHARE:
            raise ValidationError(CAPACITY_LIMITS_COUNT)


class CapacityLimitInline(admin.TabularInline):
    model = CapacityLimit
    formset = CapacityLimitFormSet
    extra = 0
    min_num = 1
    max_num = MAX_GPU_TYPES_PER_SHARE
    verbose_name = "capacity limit"


@admin.register(QuotaShare)
class QuotaShareAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "team",
        "strategy",
        "limits_display",
        "borrow_limit_display",
        "lend_limit_display",
        "in_share_preemption",
        "grace_seconds",
        "state",
    ]
    list_filter = ["strategy", "state", "team"]
    search_fields = ["name", "team__name"]
    list_select_related = ["team"]
    inlines = [CapacityLimitInline]
    actions = ["enable", "disable"]
    readonly_fields = ["history"]
    fieldsets = [
        (None, {"fields": ["name", "team", "state"]}),
        ("Sharing", {"fields": ["strategy", "borrow_limit", "weight", "strict_fifo"]}),
        (
            "Preemption",
            {"fields": ["in_share_preemption", "grace_seconds", "min_runtime_seconds"]},
        ),
        ("Change history", {"fields": ["history"]}),
    ]

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).prefetch_related("capacity_limits")

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        # Jobs, clients and the usage history know a share by its name; the services never
        # rename one (`share_update`), so neither does the change page.
        if obj is None:
            return self.readonly_fields
        return ["name", *self.readonly_fields]

    @admin.display(description="limits")
    def limits_display(self, share: QuotaShare) -> str:
        return ", ".join(f"{t}: {n}" for t, n in sorted(share.limits.items()))

    @admin.display(description="borrow limit")
    def borrow_limit_display(self, share: QuotaShare) -> str:
        if share.strategy != QuotaShare.Strategy.LEND_AND_BORROW:
            return "—"
        return "unlimited" if share.borrow_limit == -1 else f"{share.borrow_limit}%"

    @admin.display(description="lend limit")
    def lend_limit_display(self, share: QuotaShare) -> str:
        if share.strategy == QuotaShare.Strategy.RESERVE:
            return "—"
        lend = share.lend_limits
        return ", ".join(f"{t}: {n}" for t, n in sorted(lend.items())) or "all idle"

    @admin.display(description="history")
    def history(self, share: QuotaShare) -> str:
        if share.pk is None:
            return "—"
        changes = share.changes.select_related("changed_by")[:200]
        if not changes:
            return "no changes recorded"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} → {}</td></tr>",
            (
                (
                    c.changed_at.strftime("%Y-%m-%d %H:%M:%S"),
                    c.changed_by or "system",
                    c.get_source_display(),
                    c.field,
                    c.old_value or "∅",
                    c.new_value,
                )
                for c in changes
            ),
        )
        return format_html(
            '<table class="share-history"><thead><tr><th>when</th><th>who</th><th>via</th>'
            "<th>field</th><th>change</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def changelist_view(self, request: HttpRequest, extra_context=None):
        for warning in capacity_warnings():
            self.message_user(request, warning, level=messages.WARNING)
        return super().changelist_view(request, extra_context)

    def save_model(self, request: HttpRequest, obj: QuotaShare, form, change: bool) -> None:
        # The history compares the share before and after the whole save, inlines included.
        request._share_before = (
            share_state(QuotaShare.objects.get(pk=obj.pk)) if change and obj.pk else {}
        )
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        share_record_changes(
            share=form.instance,
            before=getattr(request, "_share_before", {}),
            actor=request.user,
            source=ShareChange.Source.ADMIN,
        )

    def delete_model(self, request: HttpRequest, obj: QuotaShare) -> None:
        # The delete page has already refused a share with jobs (they protect it).
        share_delete(share=obj)

    def delete_queryset(self, request: HttpRequest, queryset) -> None:
        for share in queryset:
            share_delete(share=share)

    def _set_state(self, request: HttpRequest, queryset, state: str) -> None:
        for share in queryset:
            share_set_state(
                share=share, state=state, actor=request.user, source=ShareChange.Source.ADMIN
            )
        self.message_user(request, f"{queryset.count()} share(s) now {state}.")

    @admin.action(description="Enable selected shares")
    def enable(self, request: HttpRequest, queryset) -> None:
        self._set_state(request, queryset, QuotaShare.State.ENABLED)

    @admin.action(description="Disable selected shares (they refuse new jobs)")
    def disable(self, request: HttpRequest, queryset) -> None:
        self._set_state(request, queryset, QuotaShare.State.DISABLED)
