"""`/api/v1/notifications/` routes."""

from django.urls import path

from notifications import api

app_name = "notifications-api"
urlpatterns = [
    path("subscriptions/", api.SubscriptionListCreateView.as_view(), name="subscriptions"),
    path(
        "subscriptions/<int:subscription_id>/",
        api.SubscriptionDetailView.as_view(),
        name="subscription",
    ),
    path("deliveries/", api.DeliveryListView.as_view(), name="deliveries"),
]
