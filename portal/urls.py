from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from awsbatch import pages as aws_pages
from sso.views import provider_logout


@csrf_exempt
def api_not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """API clients get JSON, not an HTML page, for a path no endpoint matches."""
    return JsonResponse({"detail": f"no API endpoint at {request.path}"}, status=404)


def health(request: HttpRequest) -> JsonResponse:
    """Liveness: the web process answers. Used by load balancers and as the benchmarks' ceiling."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    # The dashboards, for everyone: the admin's login page would refuse a team lead who is no
    # staff; admins find the admin linked from there.
    path("", RedirectView.as_view(url=settings.LOGIN_REDIRECT_URL, permanent=False)),
    # Before the admin's own: after a login through the provider, logging out ends it there too.
    path(
        "admin/logout/",
        provider_logout(admin.site.admin_view(admin.site.logout), login_page="admin:login"),
    ),
    path("admin/", admin.site.urls),
    path("health/", health, name="health"),
    # Single sign-on with the organisation's identity provider (docs/sso.md).
    path("sso/", include("sso.urls")),
    path("api/v1/agent/", include("scheduler.nodes.urls")),
    # The AWS Batch API (docs/aws.md): boto3's endpoint_url is https://PORTAL/aws.
    path("aws/", include("awsbatch.urls")),
    path("api/v1/notifications/", include("notifications.api_urls")),
    path("api/v1/", include("scheduler.api.urls")),
    # The schema and its Swagger UI are public (they describe, they hold no data); the UI's
    # assets come from drf-spectacular-sidecar through our static files, so it works offline.
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[AllowAny]),
        name="api-docs",
    ),
    # [\s\S], not ".": a path with a newline in it is no endpoint either.
    re_path(r"^api/(?P<rest>[\s\S]*)$", api_not_found),
    path("dash/notifications/", include("notifications.urls")),
    path("dash/aws-keys/", aws_pages.access_keys, name="aws_access_keys"),
    path(
        "dash/aws-keys/<str:access_key_id>/revoke/",
        aws_pages.access_key_revoke_view,
        name="aws_access_key_revoke",
    ),  # fmt: skip
    path("", include("dashboards.urls")),
]
