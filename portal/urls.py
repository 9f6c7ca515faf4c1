from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView


def health(request: HttpRequest) -> JsonResponse:
    """Liveness: the web process answers. Used by load balancers and as the benchmarks' ceiling."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("health/", health, name="health"),
    path("", include("dashboards.urls")),
]
