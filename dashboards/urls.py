from django.urls import path

from dashboards import views

app_name = "dashboards"

urlpatterns = [
    path("dash/", views.overview, name="overview"),
    path("dash/queue/", views.queue, name="queue"),
    path("dash/shares/<slug:name>/", views.share_detail, name="share"),
    path("dash/teams/<slug:slug>/", views.team_detail, name="team"),
    path("metrics", views.metrics, name="metrics"),
]
