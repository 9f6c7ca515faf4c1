from django.contrib.auth import views as auth_views
from django.urls import path

from dashboards import views

app_name = "dashboards"

urlpatterns = [
    path("dash/", views.overview, name="overview"),
    path(
        "dash/login/",
        auth_views.LoginView.as_view(template_name="dashboards/login.html"),
        name="login",
    ),
    path("dash/logout/", auth_views.LogoutView.as_view(next_page="/dash/"), name="logout"),
    path("dash/queue/", views.queue, name="queue"),
    path("dash/shares/<slug:name>/", views.share_detail, name="share"),
    path("dash/teams/<slug:slug>/", views.team_detail, name="team"),
    path("metrics", views.metrics, name="metrics"),
]
