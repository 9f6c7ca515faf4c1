"""`/api/v1/` routes. The agent endpoints (`/api/v1/agent/`) live with the node agent."""

from django.urls import path, register_converter

from scheduler.api import chargeback, views


class NodeNameConverter:
    """Node names are host names: letters, digits, dots, dashes and underscores."""

    regex = r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(NodeNameConverter, "node")

app_name = "api"
urlpatterns = [
    path("jobs/", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/estimate/", views.JobEstimateView.as_view(), name="jobs-estimate"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/ahead/", views.JobAheadView.as_view(), name="job-ahead"),
    path("shares/", views.ShareListCreateView.as_view(), name="shares"),
    path("shares/<slug:name>/", views.ShareDetailView.as_view(), name="share"),
    path("shares/<slug:name>/disable/", views.ShareDisableView.as_view(), name="share-disable"),
    path("shares/<slug:name>/enable/", views.ShareEnableView.as_view(), name="share-enable"),
    path("shares/<slug:name>/history/", views.ShareHistoryView.as_view(), name="share-history"),
    path("shares/<slug:name>/usage/", views.ShareUsageView.as_view(), name="share-usage"),
    path("queue/", views.QueueView.as_view(), name="queue"),
    path("chargeback/", chargeback.ChargebackView.as_view(), name="chargeback"),
    path("nodes/", views.NodeListView.as_view(), name="nodes"),
    path("nodes/<node:name>/", views.NodeDetailView.as_view(), name="node"),
    path("nodes/<node:name>/drain/", views.NodeDrainView.as_view(), name="node-drain"),
    path("nodes/<node:name>/undrain/", views.NodeUndrainView.as_view(), name="node-undrain"),
]
