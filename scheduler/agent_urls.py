"""Node agent endpoints, under /api/v1/agent/."""

from django.urls import path

from scheduler import agent_api

app_name = "agent"

urlpatterns = [
    path("register/", agent_api.register, name="register"),
    path("poll/", agent_api.poll, name="poll"),
    path("report/", agent_api.report, name="report"),
]
