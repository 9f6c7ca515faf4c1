"""`GET /api/v1/chargeback/`: GPU-hours per period, share and GPU type, as JSON or CSV
(docs/chargeback.md). Thin: dashboards.chargeback validates, selects and writes."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboards import chargeback
from scheduler.api.views import errors


class CsvRenderer(BaseRenderer):
    """A chargeback's rows as CSV with a header row (`?format=csv` or `Accept: text/csv`)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return chargeback.rows_csv(data["rows"]).encode(self.charset)


class ChargebackRowSerializer(serializers.Serializer):
    period_start = serializers.DateTimeField(help_text="Start of the period (UTC), included.")
    period_end = serializers.DateTimeField(help_text="End of the period (UTC), excluded.")
    share = serializers.CharField()
    team = serializers.CharField(
        allow_blank=True, help_text="The team's slug; empty for a share that no longer exists."
    )
    gpu_type = serializers.CharField()
    resolution = serializers.ChoiceField(
        choices=["raw", "minute", "hour"],
        help_text="The history read, as the dashboards' charts read it for the same period.",
    )
    sampled_hours = serializers.FloatField(help_text="Hours the history covers.")
    quota_gpu_hours = serializers.FloatField(help_text="The limit over the sampled time.")
    used_gpu_hours = serializers.FloatField(help_text="own + borrowed.")
    own_gpu_hours = serializers.FloatField(help_text="Used within the limit (on own quota).")
    borrowed_gpu_hours = serializers.FloatField(help_text="Used above the limit.")
    lent_gpu_hours = serializers.FloatField(help_text="Idle GPUs of the limit borrowers used.")
    reclaimed_from_gpu_hours = serializers.FloatField(
        help_text="Work of the share's jobs lost when other shares reclaimed GPUs from them."
    )
    reclaimed_for_gpu_hours = serializers.FloatField(
        help_text="Work of other shares' jobs lost when they were preempted for this share's."
    )
    lost_gpu_hours = serializers.FloatField(
        help_text="Work of the share's jobs lost to every preemption (since the last checkpoint)."
    )
    preemptions = serializers.IntegerField(help_text="The share's attempts preempted.")
    reclaims_from = serializers.IntegerField(help_text="Of them, by another share's reclaim.")
    reclaims_for = serializers.IntegerField(
        help_text="Other shares' attempts preempted for this share's jobs."
    )


class ChargebackSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    timezone = serializers.ChoiceField(choices=["UTC"])
    per = serializers.ChoiceField(choices=list(chargeback.PER_CHOICES))
    columns = serializers.ListField(child=serializers.CharField(), help_text="The CSV header.")
    rows = ChargebackRowSerializer(many=True)


RANGE_HELP = (
    "A date YYYY-MM-DD (00:00) or a time YYYY-MM-DDTHH:MM[:SS]; UTC unless it ends in an "
    "offset (+HH:MM, URL-encoded)."
)


class ChargebackView(APIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        operation_id="chargeback",
        summary="GPU-hours per period, share and GPU type: used, borrowed, lent, reclaimed, lost",
        description="The range is [start, end) in UTC, or a calendar month, at most "
        f"{chargeback.MAX_DAYS} days; `per=month` cuts it at each first of a month. Admins "
        "see every share, team leads their teams' shares; members and outsiders get 403. "
        "`format=csv` (or `Accept: text/csv`) answers CSV with a header row. Columns: "
        "docs/chargeback.md.",
        parameters=[
            OpenApiParameter("start", str, description=f"Start, included. {RANGE_HELP}"),
            OpenApiParameter("end", str, description=f"End, excluded. {RANGE_HELP}"),
            OpenApiParameter("month", str, description="YYYY-MM, instead of start and end."),
            OpenApiParameter("per", str, enum=list(chargeback.PER_CHOICES)),
            OpenApiParameter("team", str, description="Only this team's shares (its slug)."),
            OpenApiParameter("share", str, description="Only this share."),
            OpenApiParameter("format", str, enum=list(chargeback.FORMATS)),
        ],
        responses={
            (200, "application/json"): ChargebackSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, header row."),
            **errors(400, 403, 404),
        },
    )
    def get(self, request):
        if not chargeback.can_read_chargeback(request.user):
            raise PermissionDenied(chargeback.CHARGEBACK_FORBIDDEN)
        params = request.query_params
        wanted = chargeback.chargeback_request(
            start=params.get("start"),
            end=params.get("end"),
            month=params.get("month"),
            per=params.get("per"),
            format=params.get(self.settings.URL_FORMAT_OVERRIDE),
        )
        try:
            names = chargeback.chargeback_shares(
                request.user, team=params.get("team", ""), share=params.get("share", "")
            )
        except chargeback.NotVisible as hidden:
            raise NotFound({hidden.field: [str(hidden)]}) from None
        rows = chargeback.chargeback(wanted, shares=names)
        response = Response(chargeback.report(wanted, rows))
        if request.accepted_renderer.format == CsvRenderer.format:
            name = chargeback.filename(wanted, "csv")
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def perform_content_negotiation(self, request, force=False):
        # DRF answers a ?format= none of the renderers has with a bare 404: take JSON instead,
        # and let chargeback_request refuse the format with a 400 naming it.
        asked = request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
        unknown = bool(asked) and asked not in chargeback.FORMATS
        return super().perform_content_negotiation(request, force=force or unknown)

    def finalize_response(self, request, response, *args, **kwargs):
        # Only a chargeback has rows to write as CSV. Errors ({field: [message]}) and the
        # answer to OPTIONS are JSON whatever format was asked for: a client that asked for a
        # CSV still gets a readable 4xx.
        if not (isinstance(response.data, dict) and "rows" in response.data):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
