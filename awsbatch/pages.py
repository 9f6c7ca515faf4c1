"""Everyone's own AWS-style access keys, on the dashboards (`/dash/aws-keys/`): the keys that
sign requests to the AWS Batch API (boto3, the aws CLI), made, listed and revoked by the user
they act as. Until now only an admin could make one (the admin, `manage.py aws_access_key`)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required as _login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods, require_POST

from awsbatch.keys import TooManyKeys, access_key_create_own, access_key_revoke
from awsbatch.models import AccessKey
from dashboards.selectors import navigation

login_required = _login_required(login_url=reverse_lazy("dashboards:login"))
MAX_DESCRIPTION_CHARS = AccessKey._meta.get_field("description").max_length


@login_required
@require_http_methods(["GET", "POST"])
def access_keys(request: HttpRequest) -> HttpResponse:
    """The user's keys; on POST a new one, its secret shown on that answer only."""
    made, error, status = None, "", 200
    keys = AccessKey.objects.filter(user=request.user)
    if request.method == "POST":
        description = request.POST.get("description", "").strip()[:MAX_DESCRIPTION_CHARS]
        try:
            made = access_key_create_own(user=request.user, description=description)
        except TooManyKeys as refused:
            error, status = str(refused), 400
    context = {
        **navigation(request.user),
        "keys": keys.order_by("-created_at"),
        "made": made,
        "error": error,
        "endpoint": request.build_absolute_uri("/aws"),
        "max_description": MAX_DESCRIPTION_CHARS,
    }
    return render(request, "awsbatch/access_keys.html", context, status=status)


@login_required
@require_POST
def access_key_revoke_view(request: HttpRequest, access_key_id: str) -> HttpResponse:
    key = AccessKey.objects.filter(user=request.user, access_key_id=access_key_id).first()
    if key is None:
        raise Http404("No such access key among yours.")
    access_key_revoke(key=key)
    return redirect("aws_access_keys")
