"""`/api/v1/notifications/`: a user's own subscriptions (list, create, describe, delete) and
the record of their deliveries. Each view checks who asks, then calls a selector or a
service; bad input is a 400 naming the field and the rule (the services' messages)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications import selectors, services
from notifications.models import Delivery, Kind, Subscription
from portal.choices import choice_errors
from portal.ids import is_row_id
from portal.pagination import Pagination

SUBSCRIPTION_NOT_FOUND = "no subscription {subscription_id} among your subscriptions."

ERRORS = {
    400: OpenApiResponse(OpenApiTypes.OBJECT, description="Invalid input: {field: [messages]}."),
    401: OpenApiResponse(OpenApiTypes.OBJECT, description="No or bad credentials."),
    404: OpenApiResponse(OpenApiTypes.OBJECT, description="Not found among yours."),
}


def errors(*codes: int) -> dict:
    return {code: ERRORS[code] for code in (401, *codes)}


class SubscriptionSerializer(serializers.ModelSerializer):
    share = serializers.CharField(source="share.name", allow_null=True, default=None)
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=Kind.choices))
    signed = serializers.SerializerMethodField(help_text="Webhook messages carry a signature.")

    class Meta:
        model = Subscription
        fields = ["id", "scope", "share", "kinds", "channel", "target", "signed", "created_at"]
        read_only_fields = fields

    def get_signed(self, subscription: Subscription) -> bool:
        return bool(subscription.secret)


class SubscriptionCreatedSerializer(SubscriptionSerializer):
    secret = serializers.CharField(
        help_text="The webhook's HMAC-SHA256 key (empty for other channels): shown only now."
    )

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class SubscriptionCreateSerializer(serializers.Serializer):
    scope = serializers.ChoiceField(
        choices=Subscription.Scope.choices,
        error_messages=choice_errors("scope", Subscription.Scope),
    )
    share = serializers.CharField(
        max_length=63, required=False, allow_blank=True, default="",
        help_text="The share's name, for scope 'share': one of your teams' shares.",
    )  # fmt: skip
    kinds = serializers.ListField(
        child=serializers.ChoiceField(
            choices=Kind.choices, error_messages=choice_errors("kinds", Kind)
        ),
        allow_empty=False,
        max_length=20,
    )
    channel = serializers.ChoiceField(
        choices=Subscription.Channel.choices,
        error_messages=choice_errors("channel", Subscription.Channel),
    )
    target = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default="",
        help_text="E-mail address (default: your account's) or the webhook's http(s) URL.",
    )  # fmt: skip
    secret = serializers.CharField(
        max_length=128, required=False, allow_blank=True, default="",
        help_text="A webhook's HMAC key (16 to 128 characters); empty: the portal makes one.",
    )  # fmt: skip


class DeliverySerializer(serializers.ModelSerializer):
    tries = serializers.ListField(child=serializers.DictField(), read_only=True)
    payload = serializers.DictField(read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id", "subscription", "kind", "state", "attempts", "created_at", "next_attempt_at",
            "sent_at", "last_error", "tries", "payload",
        ]  # fmt: skip
        read_only_fields = fields


class DeliveryFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=Delivery.State.choices, required=False,
        error_messages=choice_errors("state", Delivery.State),
    )  # fmt: skip


class SubscriptionListCreateView(generics.GenericAPIView):
    pagination_class = Pagination
    serializer_class = SubscriptionSerializer

    @extend_schema(
        operation_id="notifications_subscriptions_list",
        summary="Your subscriptions",
        responses={200: SubscriptionSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request):
        page = self.paginate_queryset(selectors.subscriptions_of(request.user))
        return self.get_paginated_response(SubscriptionSerializer(page, many=True).data)

    @extend_schema(
        operation_id="notifications_subscriptions_create",
        summary="Subscribe to events of your own jobs or of one of your teams' shares",
        description="The events: " + ", ".join(f"`{k}` ({k.label})" for k in Kind) + ". A "
        "subscription to your own jobs takes the job events only. A webhook's messages are "
        "signed with its secret (X-Portal-Signature-256), returned only in this answer.",
        request=SubscriptionCreateSerializer,
        responses={201: SubscriptionCreatedSerializer, **errors(400)},
    )
    def post(self, request):
        serializer = SubscriptionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        subscription = services.subscription_create(
            user=request.user, share_name=data.pop("share"), **data
        )
        return Response(
            SubscriptionCreatedSerializer(subscription).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": f"/api/v1/notifications/subscriptions/{subscription.pk}/"},
        )


def own_subscription(request, subscription_id: int) -> Subscription:
    found = (
        selectors.subscriptions_of(request.user).filter(pk=subscription_id).first()
        if is_row_id(subscription_id)
        else None
    )
    if found is None:
        raise NotFound(SUBSCRIPTION_NOT_FOUND.format(subscription_id=subscription_id))
    return found


class SubscriptionDetailView(APIView):
    @extend_schema(
        operation_id="notifications_subscriptions_describe",
        summary="One of your subscriptions",
        responses={200: SubscriptionSerializer, **errors(404)},
    )
    def get(self, request, subscription_id: int):
        return Response(SubscriptionSerializer(own_subscription(request, subscription_id)).data)

    @extend_schema(
        operation_id="notifications_subscriptions_delete",
        summary="Unsubscribe (its deliveries not sent yet are dropped)",
        responses={204: None, **errors(404)},
    )
    def delete(self, request, subscription_id: int):
        services.subscription_delete(subscription=own_subscription(request, subscription_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryListView(generics.GenericAPIView):
    pagination_class = Pagination
    serializer_class = DeliverySerializer

    @extend_schema(
        operation_id="notifications_deliveries_list",
        summary="What was sent to you, or is being tried, newest first",
        parameters=[OpenApiParameter("state", str, enum=Delivery.State.values)],
        responses={200: DeliverySerializer(many=True), **errors(400, 404)},
    )
    def get(self, request):
        filters = DeliveryFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        deliveries = selectors.deliveries_of(request.user)
        if "state" in filters.validated_data:
            deliveries = deliveries.filter(state=filters.validated_data["state"])
        page = self.paginate_queryset(deliveries)
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)
