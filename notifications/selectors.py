"""Reads of a user's subscriptions and deliveries, for the API and the page."""

from __future__ import annotations

from django.db.models import QuerySet

from notifications.models import Delivery, Subscription
from shares.models import QuotaShare
from shares.selectors import shares_visible_to


def subscriptions_of(user) -> QuerySet[Subscription]:
    return Subscription.objects.filter(user=user).select_related("share").order_by("id")


def deliveries_of(user) -> QuerySet[Delivery]:
    """The user's deliveries, newest first."""
    return (
        Delivery.objects.filter(subscription__user=user)
        .select_related("subscription__share")
        .order_by("-created_at", "-id")
    )


def subscribable_shares(user) -> QuerySet[QuotaShare]:
    """The shares a user may subscribe to: those of their teams (an admin: all)."""
    return shares_visible_to(user).order_by("name")
