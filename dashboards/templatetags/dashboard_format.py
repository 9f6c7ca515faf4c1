from datetime import UTC, datetime, timedelta

from django import template
from django.utils import dateformat
from django.utils.html import format_html

register = template.Library()


@register.filter
def duration(value: timedelta | None) -> str:
    """'3 d 4 h', '2 h 05 min', '4 min 10 s', '12 s' — waits at a glance."""
    if value is None:
        return "—"
    seconds = max(0, int(value.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {seconds:02d} s"
    return f"{seconds} s"


@register.filter
def moment(value: datetime | None, shown: str = "Y-m-d H:i") -> str:
    """A time as the pages show it (`shown`: a `date` format, and " UTC" at its end to say so
    where no column header does), marked so that times.js adds how far it is from now
    ("in 20 min", "3 min ago") and keeps that current; "—" for none."""
    if value is None:
        return "—"
    at = value.astimezone(UTC)
    shown, utc, _ = shown.partition(" UTC")
    return format_html(
        '<time datetime="{}" data-from-now>{}{}</time>',
        at.isoformat(),
        dateformat.format(at, shown),
        utc,
    )
