"""`{% chargeback_links range team=slug %}`: the download links of a page's chargeback
(docs/chargeback.md): the page's range, the last and the current calendar month (UTC)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django import template
from django.urls import reverse
from django.utils import timezone

from dashboards.chargeback import month_range
from dashboards.selectors import TimeRange

register = template.Library()

SECOND_FORMAT = "%Y-%m-%dT%H:%M:%S"


def _url(team: str, fmt: str, **range_params: str) -> str:
    params = {**range_params, **({"team": team} if team else {}), "format": fmt}
    return f"{reverse('api:chargeback')}?{urlencode(params)}"


def _whole_seconds(start: datetime, end: datetime) -> dict[str, str]:
    """The range to the second, widened so that it still holds every sample of the page's."""
    start = start.astimezone(UTC).replace(microsecond=0)
    end = datetime.fromtimestamp(math.ceil(end.timestamp()), UTC)
    return {"start": f"{start:{SECOND_FORMAT}}", "end": f"{end:{SECOND_FORMAT}}"}


@register.inclusion_tag("dashboards/_chargeback_links.html")
def chargeback_links(time_range: TimeRange, team: str = "") -> dict:
    this_month, _ = month_range(timezone.now())
    last_month, _ = month_range(this_month - timedelta(days=1))
    in_range = _whole_seconds(time_range.start, time_range.end)
    return {
        "range_csv": _url(team, "csv", **in_range),
        "range_json": _url(team, "json", **in_range),
        "last_month": f"{last_month:%Y-%m}",
        "last_month_csv": _url(team, "csv", month=f"{last_month:%Y-%m}"),
        "this_month": f"{this_month:%Y-%m}",
        "this_month_csv": _url(team, "csv", month=f"{this_month:%Y-%m}"),
    }
