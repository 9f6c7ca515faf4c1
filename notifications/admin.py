from django.contrib import admin

from notifications.models import Delivery, Subscription
from notifications.services import delivery_retry


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    """Who listens to what. Users make their own (the page, the API: the service checks them);
    an admin sees and may delete them. A webhook's secret is not shown."""

    list_display = ("user", "scope", "share", "channel", "target", "kinds", "created_at")
    list_select_related = ("user", "share")
    list_filter = ("scope", "channel", "share")
    search_fields = ("user__username", "target")
    exclude = ("secret",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """The record of every message: read-only, except trying one again."""

    list_display = ("created_at", "kind", "subscription", "state", "attempts", "sent_at")
    list_select_related = ("subscription__user", "subscription__share")
    list_filter = ("state", "kind", "subscription__channel")
    search_fields = ("subscription__user__username", "subscription__target", "last_error")
    actions = ["retry_now"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Try again at the next dispatch")
    def retry_now(self, request, queryset) -> None:
        for delivery in queryset:
            delivery_retry(delivery=delivery)
