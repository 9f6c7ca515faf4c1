"""The API's views: each checks who asks, then calls a selector or a service."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.ids import is_row_id
from portal.pagination import Pagination
from scheduler.api import serializers as s
from scheduler.api.permissions import (
    IsAdmin,
    require_admin,
    require_can_cancel_job,
    require_can_update_job,
)
from scheduler.jobs import services as job_services
from scheduler.jobs.selectors import ahead_seen_by, job_detail, job_list, queue_snapshot
from scheduler.models import Job, Node
from scheduler.nodes import services as node_services
from scheduler.nodes.selectors import node_list
from shares import services as share_services
from shares.models import QuotaShare, ShareChange, Team
from shares.selectors import is_admin, share_usage, shares_visible_to

SHARE_NOT_FOUND = "share: no share named {name!r}."
SHARE_NOT_YOURS = (
    "share: no share named {name!r} among your teams' shares (it does not exist, or you are "
    "not a member of the team that owns it)."
)
JOB_NOT_FOUND = "no job {job_id} among the jobs you may see."
NODE_NOT_FOUND = "no node named {name!r}."
TEAM_UNKNOWN = "team: no team with slug {slug!r}."

ERRORS = {
    400: OpenApiResponse(OpenApiTypes.OBJECT, description="Invalid input: {field: [messages]}."),
    401: OpenApiResponse(OpenApiTypes.OBJECT, description="No or bad credentials."),
    403: OpenApiResponse(OpenApiTypes.OBJECT, description="Visible, but not yours to change."),
    404: OpenApiResponse(OpenApiTypes.OBJECT, description="Not found, or not visible to you."),
}


def errors(*codes: int) -> dict:
    return {code: ERRORS[code] for code in (401, *codes)}


def visible_job(request, job_id: int) -> Job:
    job = job_detail(user=request.user, job_id=job_id) if is_row_id(job_id) else None
    if job is None:
        raise NotFound(JOB_NOT_FOUND.format(job_id=job_id))
    return job


def visible_share(request, name: str) -> QuotaShare:
    share = shares_visible_to(request.user).filter(name=name).first()
    if share is None:
        raise NotFound(SHARE_NOT_FOUND.format(name=name))
    return share


# --- Jobs -------------------------------------------------------------------------------------


class JobListCreateView(generics.GenericAPIView):
    pagination_class = Pagination
    serializer_class = s.JobSerializer

    @extend_schema(
        operation_id="jobs_list",
        summary="List jobs (AWS ListServiceJobs)",
        parameters=[
            OpenApiParameter("share", str, description="Share name."),
            OpenApiParameter(
                "state",
                str,
                many=True,
                enum=Job.State.values,
                description="One or more states (repeat the parameter).",
            ),
            OpenApiParameter("submitted_by", str, description="Username."),
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="Submitted at or after."),
            OpenApiParameter("gpu_type", str),
        ],
        responses={200: s.JobSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request):
        filters = s.JobListFilterSerializer(
            data={
                **{k: v for k, v in request.query_params.items() if k != "state"},
                **(
                    {"state": request.query_params.getlist("state")}
                    if "state" in request.query_params
                    else {}
                ),
            }
        )
        filters.is_valid(raise_exception=True)
        data = filters.validated_data
        jobs = job_list(
            user=request.user,
            share=data.get("share"),
            states=sorted(data.get("state") or []),
            submitted_by=data.get("submitted_by"),
            since=data.get("since"),
            gpu_type=data.get("gpu_type"),
        )
        page = self.paginate_queryset(jobs)
        return self.get_paginated_response(s.JobSerializer(page, many=True).data)

    @extend_schema(
        operation_id="jobs_submit",
        summary="Submit a job (AWS SubmitServiceJob)",
        description="201 with the new job; 200 with the first job when `client_token` was "
        "already used with the same request; 409 when it was used with a different one. "
        "A share you are not a member of is 404, like one that does not exist.",
        request=s.JobSubmitSerializer,
        responses={
            201: s.JobSerializer,
            200: s.JobSerializer,
            **errors(400, 404),
            409: OpenApiResponse(OpenApiTypes.OBJECT, description="client_token reused."),
            413: OpenApiResponse(OpenApiTypes.OBJECT, description="Body too large."),
        },
    )
    def post(self, request):
        serializer = s.JobSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        share_name = data.pop("share")
        try:
            job, created = job_services.job_submit(
                user=request.user,
                share_name=share_name,
                members_only=True,
                fields_validated=True,
                **data,
            )
        except job_services.ShareNotVisible:
            return share_not_visible(request, share_name)
        return Response(
            s.job_data(job),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            headers={"Location": f"/api/v1/jobs/{job.pk}/"},
        )


def share_not_visible(request, share_name: str) -> Response:
    """404 for a share the caller may not see, worded for an admin or a member."""
    message = (SHARE_NOT_FOUND if is_admin(request.user) else SHARE_NOT_YOURS).format(
        name=share_name
    )
    return Response({"share": [message]}, status=status.HTTP_404_NOT_FOUND)


class JobEstimateView(APIView):
    @extend_schema(
        operation_id="jobs_estimate",
        summary="When would this job start? (what-if: nothing is stored)",
        description="The same body as a submit, checked by the same rules, the command "
        "optional; the answer is when the job would start if it were submitted now, behind the "
        "queue as it is and assuming no other new job, and why it would wait "
        "(docs/estimates.md).",
        request=s.JobWhatIfSerializer,
        responses={200: s.JobEstimateSerializer, **errors(400, 404)},
    )
    def post(self, request):
        serializer = s.JobWhatIfSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        share_name = data.pop("share")
        try:
            answer = job_services.job_estimate(
                user=request.user, share_name=share_name, members_only=True,
                fields_validated=True, **data,
            )  # fmt: skip
        except job_services.ShareNotVisible:
            return share_not_visible(request, share_name)
        return Response(s.JobEstimateSerializer(answer).data)


class JobDetailView(APIView):
    @extend_schema(
        operation_id="jobs_describe",
        summary="Describe a job (AWS DescribeServiceJob)",
        responses={200: s.JobDetailSerializer, **errors(404)},
    )
    def get(self, request, job_id: int):
        return Response(s.JobDetailSerializer(visible_job(request, job_id)).data)

    @extend_schema(
        operation_id="jobs_update",
        summary="Change a job's priority (AWS UpdateServiceJob)",
        request=s.JobUpdateSerializer,
        responses={200: s.JobDetailSerializer, **errors(400, 403, 404)},
    )
    def patch(self, request, job_id: int):
        job = visible_job(request, job_id)
        require_can_update_job(request.user, job)
        serializer = s.JobUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job_services.job_set_priority(job=job, priority=serializer.validated_data["priority"])
        return Response(s.JobDetailSerializer(visible_job(request, job_id)).data)


class JobAheadView(APIView):
    @extend_schema(
        operation_id="jobs_ahead",
        summary="Who is ahead of a waiting job, and whose jobs hold what it waits for",
        responses={200: s.AheadSerializer, **errors(404)},
    )
    def get(self, request, job_id: int):
        where = ahead_seen_by(request.user, visible_job(request, job_id))
        data = {
            "position": where.position,
            "count": where.count,
            "gpus": where.gpus,
            "ahead": [
                {
                    "position": entry.position,
                    "considered_as": entry.pass_,
                    "job": entry.job_id,
                    "share": entry.share,
                    "gpus": entry.gpus,
                    "priority": entry.priority,
                }
                for entry in where.ahead
            ],
            "holders": [
                {"job": h.job_id, "share": h.share, "gpus": h.gpus, "stopping": h.stopping}
                for h in where.holders
            ],
        }
        return Response(s.AheadSerializer(data).data)


class JobCancelView(APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job (AWS TerminateServiceJob)",
        description="A queued job ends at once (CANCELLED). A job holding GPUs is stopped like a "
        "preemption, with its share's grace period, and ends CANCELLED when its node confirms. "
        "Cancelling a cancelled job again is a no-op; a job that succeeded or failed is a 409.",
        request=None,
        responses={
            200: s.JobDetailSerializer,
            **errors(403, 404),
            409: OpenApiResponse(OpenApiTypes.OBJECT, description="The job already ended."),
        },
    )
    def post(self, request, job_id: int):
        job = visible_job(request, job_id)
        require_can_cancel_job(request.user, job)
        if job.state in (Job.State.SUCCEEDED, Job.State.FAILED):
            return Response(
                {"detail": job_services.ALREADY_FINAL.format(job=job.pk, state=job.state)},
                status=status.HTTP_409_CONFLICT,
            )
        job_services.job_cancel(job=job, user=request.user)
        return Response(s.JobDetailSerializer(visible_job(request, job_id)).data)


# --- Shares -----------------------------------------------------------------------------------


def _share_settings(data: dict) -> dict:
    """Validated share fields → share_create / share_update keyword arguments."""
    data = dict(data)
    if "team" in data:
        slug = data["team"]
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            from rest_framework.exceptions import ValidationError

            raise ValidationError({"team": [TEAM_UNKNOWN.format(slug=slug)]})
        data["team"] = team
    if "lend_limit" in data and data["lend_limit"] is None:
        data["lend_limit"] = {}  # null clears the lend limits: every idle GPU may be lent
    return data


class ShareListCreateView(generics.GenericAPIView):
    serializer_class = s.ShareSerializer
    pagination_class = None

    @extend_schema(
        operation_id="shares_list",
        summary="List the shares you may see, with live usage",
        responses={200: s.ShareSerializer(many=True), **errors()},
    )
    def get(self, request):
        shares = shares_visible_to(request.user)
        context = {"usage": share_usage()}
        return Response(s.ShareSerializer(shares, many=True, context=context).data)

    @extend_schema(
        operation_id="shares_create",
        summary="Create a share (admins)",
        request=s.ShareWriteSerializer,
        responses={201: s.ShareSerializer, **errors(400, 403)},
    )
    def post(self, request):
        require_admin(request.user, "create shares")
        serializer = s.ShareWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        share = share_services.share_create(
            **_share_settings(serializer.validated_data),
            actor=request.user,
            source=ShareChange.Source.API,
        )
        share = shares_visible_to(request.user).get(pk=share.pk)
        return Response(
            s.ShareSerializer(share, context={"usage": share_usage()}).data,
            status=status.HTTP_201_CREATED,
        )


class ShareDetailView(APIView):
    @extend_schema(
        operation_id="shares_describe",
        summary="Describe a share with its live usage",
        responses={200: s.ShareSerializer, **errors(404)},
    )
    def get(self, request, name: str):
        share = visible_share(request, name)
        return Response(s.ShareSerializer(share, context={"usage": share_usage()}).data)

    @extend_schema(
        operation_id="shares_update",
        summary="Change a share (admins); recorded in its history",
        request=s.ShareUpdateSerializer,
        responses={200: s.ShareSerializer, **errors(400, 403, 404)},
    )
    def patch(self, request, name: str):
        share = visible_share(request, name)
        require_admin(request.user, "change shares")
        serializer = s.ShareUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        share_services.share_update(
            share=share,
            actor=request.user,
            source=ShareChange.Source.API,
            **_share_settings(serializer.validated_data),
        )
        share = visible_share(request, name)
        return Response(s.ShareSerializer(share, context={"usage": share_usage()}).data)


class ShareStateView(APIView):
    state: str = QuotaShare.State.DISABLED

    @extend_schema(request=None, responses={200: s.ShareSerializer, **errors(403, 404)})
    def post(self, request, name: str):
        share = visible_share(request, name)
        require_admin(request.user, "enable or disable shares")
        share_services.share_set_state(
            share=share, state=self.state, actor=request.user, source=ShareChange.Source.API
        )
        share = visible_share(request, name)
        return Response(s.ShareSerializer(share, context={"usage": share_usage()}).data)


class ShareDisableView(ShareStateView):
    """Disable a share (admins): it refuses new jobs; its queued and running jobs carry on."""

    state = QuotaShare.State.DISABLED


class ShareEnableView(ShareStateView):
    """Enable a share again (admins)."""

    state = QuotaShare.State.ENABLED


class ShareHistoryView(generics.GenericAPIView):
    pagination_class = Pagination
    serializer_class = s.ShareChangeSerializer

    @extend_schema(
        operation_id="shares_history",
        summary="A share's change history, newest first",
        responses={200: s.ShareChangeSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request, name: str):
        share = visible_share(request, name)
        changes = share.changes.select_related("changed_by").order_by("-changed_at", "-id")
        page = self.paginate_queryset(changes)
        return self.get_paginated_response(s.ShareChangeSerializer(page, many=True).data)


class ShareUsageView(APIView):
    @extend_schema(
        operation_id="shares_usage",
        summary="A share's usage over time",
        description="`series` is {gpu_type: [{t, own, borrowed, lent, limit}]}, oldest first. "
        "Until utilisation sampling lands, each series holds one point: now.",
        responses={200: s.ShareUsageSeriesSerializer, **errors(404)},
    )
    def get(self, request, name: str):
        share = visible_share(request, name)
        now = timezone.now()
        rows = share_usage().shares.get(share.name, {})
        series = {
            gpu_type: [
                {
                    "t": now,
                    "own": row.own,
                    "borrowed": row.borrowed,
                    "lent": row.lent,
                    "limit": row.limit,
                }
            ]
            for gpu_type, row in rows.items()
        }
        return Response(s.ShareUsageSeriesSerializer({"share": share.name, "series": series}).data)


# --- Queue and nodes --------------------------------------------------------------------------


class QueueView(APIView):
    @extend_schema(
        operation_id="queue_snapshot",
        summary="The front of the queue and each share's usage (AWS GetJobQueueSnapshot)",
        description="The first 100 runnable jobs in the order the scheduler considers them: "
        "jobs within their share's limit first, then borrowers, each by priority then "
        "submission. You see your teams' jobs with their place in the whole queue, and your "
        "teams' shares; `pool` is the cluster per GPU type.",
        responses={200: s.QueueSnapshotSerializer, **errors()},
    )
    def get(self, request):
        snapshot = queue_snapshot()
        visible = None if is_admin(request.user) else _visible_share_names(request.user)
        front = [e for e in snapshot.front if visible is None or e.job.share.name in visible]
        shares = {
            name: {t: row.as_dict() for t, row in rows.items()}
            for name, rows in snapshot.usage.shares.items()
            if visible is None or name in visible
        }
        data = {
            "at": timezone.now(),
            "runnable": snapshot.runnable,
            "front": front,
            "shares": shares,
            "pool": {t: row.as_dict() for t, row in snapshot.usage.pool.items()},
        }
        return Response(s.QueueSnapshotSerializer(data).data)


def _visible_share_names(user) -> set[str]:
    return set(shares_visible_to(user).values_list("name", flat=True))


def _node_context(request) -> dict:
    if is_admin(request.user):
        return {"visible_share_ids": None}
    return {"visible_share_ids": set(shares_visible_to(request.user).values_list("pk", flat=True))}


class NodeListView(generics.GenericAPIView):
    serializer_class = s.NodeSerializer
    pagination_class = None

    @extend_schema(
        operation_id="nodes_list",
        summary="Nodes with their GPUs, state and running jobs",
        responses={200: s.NodeSerializer(many=True), **errors()},
    )
    def get(self, request):
        nodes = s.NodeSerializer(node_list(), many=True, context=_node_context(request))
        return Response(nodes.data)


def _node(name: str) -> Node:
    try:
        return get_object_or_404(node_list(), name=name)
    except Http404 as missing:
        raise NotFound(NODE_NOT_FOUND.format(name=name)) from missing


class NodeDetailView(APIView):
    @extend_schema(
        operation_id="nodes_describe",
        summary="One node",
        responses={200: s.NodeSerializer, **errors(404)},
    )
    def get(self, request, name: str):
        return Response(s.NodeSerializer(_node(name), context=_node_context(request)).data)


class NodeStateChangeSerializer(serializers.Serializer):
    """The body of a drain or undrain, which may be empty: why (its length is the service's
    rule, MAX_NODE_REASON)."""

    reason = serializers.CharField(required=False, allow_blank=True, default="")


class NodeStateView(APIView):
    """Set a node's state; the node's `state_reason` records the admin's name and `reason`."""

    permission_classes = [IsAdmin]
    state: str = Node.State.DRAINING

    @extend_schema(
        request=NodeStateChangeSerializer,
        responses={200: s.NodeSerializer, **errors(400, 403, 404)},
    )
    def post(self, request, name: str):
        node = _node(name)
        body = NodeStateChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node_services.node_set_state(
            node=node, state=self.state, user=request.user, reason=body.validated_data["reason"]
        )
        return Response(s.NodeSerializer(_node(name), context=_node_context(request)).data)


class NodeDrainView(NodeStateView):
    """Drain a node (admins): its jobs finish, it gets no new ones. Its state reason says who
    drained it and why ("drained by root: ECC errors on GPU 3")."""

    state = Node.State.DRAINING


class NodeUndrainView(NodeStateView):
    """Undrain a node (admins): it takes new jobs again. Its state reason says who undrained it
    and why."""

    state = Node.State.READY
