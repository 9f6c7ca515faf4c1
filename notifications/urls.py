from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.subscriptions, name="subscriptions"),
    path("<int:subscription_id>/delete/", views.subscription_delete, name="delete"),
]
