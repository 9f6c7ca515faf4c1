"""Node agent endpoints, under /api/v1/agent/."""

from django.urls import path

from scheduler.nodes import views

app_name = "agent"

urlpatterns = [
    path("register/", views.register, name="register"),
    path("poll/", views.poll, name="poll"),
    path("start/", views.start, name="start"),
    path("report/", views.report, name="report"),
    path("connector/register/", views.connector_register, name="connector-register"),
    path("connector/poll/", views.connector_poll, name="connector-poll"),
    path("connector/start/", views.connector_start, name="connector-start"),
    path("connector/report/", views.connector_report, name="connector-report"),
]
