"""The subscription page (/dash/notifications/): every signed-in user's own subscriptions,
a form to add one, and the latest deliveries. Thin: selectors read, services write."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required as _login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods, require_POST

from dashboards import selectors as dashboard_selectors
from notifications import selectors, services
from notifications.forms import SubscriptionForm

login_required = _login_required(login_url=reverse_lazy("dashboards:login"))
LATEST_DELIVERIES = 50


def _page(request: HttpRequest, form: SubscriptionForm, created=None, status: int = 200):
    context = {
        "form": form,
        "created": created,
        "subscriptions": selectors.subscriptions_of(request.user),
        "deliveries": selectors.deliveries_of(request.user)[:LATEST_DELIVERIES],
        **dashboard_selectors.navigation(request.user),
    }
    return render(request, "notifications/subscriptions.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def subscriptions(request: HttpRequest) -> HttpResponse:
    """GET: the page. POST: a new subscription; the page then shows a webhook's secret once."""
    shares = selectors.subscribable_shares(request.user)
    if request.method == "GET":
        return _page(request, SubscriptionForm(shares=shares))
    form = SubscriptionForm(request.POST, shares=shares)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    try:
        created = services.subscription_create(
            user=request.user, scope=data["scope"], share_name=data["share"],
            kinds=data["kinds"], channel=data["channel"], target=data["target"],
            secret=data["secret"],
        )  # fmt: skip
    except ValidationError as error:
        for field, messages in error.message_dict.items():
            form.add_error(field if field in form.fields else None, messages)
        return _page(request, form, status=400)
    return _page(request, SubscriptionForm(shares=shares), created=created)


@login_required
@require_POST
def subscription_delete(request: HttpRequest, subscription_id: int) -> HttpResponse:
    subscription = selectors.subscriptions_of(request.user).filter(pk=subscription_id).first()
    if subscription is None:
        raise Http404("no such subscription of yours")
    services.subscription_delete(subscription=subscription)
    return redirect("notifications:subscriptions")
