from django.contrib.auth import views as auth_views
from django.urls import path

from dashboards import views
from sso.views import provider_logout

app_name = "dashboards"

urlpatterns = [
    path("dash/", views.overview, name="overview"),
    path(
        "dash/login/",
        auth_views.LoginView.as_view(template_name="dashboards/login.html"),
        name="login",
    ),
    path(
        "dash/logout/",
        provider_logout(
            auth_views.LogoutView.as_view(next_page="/dash/"), login_page="dashboards:login"
        ),
        name="logout",
    ),
    path("dash/queue/", views.queue, name="queue"),
    path("dash/jobs/", views.jobs, name="jobs"),
    path("dash/jobs/estimate/", views.job_estimate_view, name="job_estimate"),
    path("dash/jobs/<int:job_id>/", views.job_view, name="job"),
    path("dash/jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job_cancel"),
    path("dash/jobs/<int:job_id>/priority/", views.job_priority_view, name="job_priority"),
    path("dash/token/", views.api_token, name="api_token"),
    path("dash/shares/<slug:name>/", views.share_detail, name="share"),
    path("dash/teams/<slug:slug>/", views.team_detail, name="team"),
    path("docs/", views.docs_index, name="docs"),
    path("docs/<slug:name>/", views.doc_page, name="doc"),
    path("metrics", views.metrics, name="metrics"),
]
