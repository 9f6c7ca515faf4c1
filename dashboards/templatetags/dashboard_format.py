from datetime import timedelta

from django import template

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
