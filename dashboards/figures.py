"""Plotly figures, built on the server. Each share has one colour on every page, derived from
its name, so a lead recognises it at a glance.

Figures are plain dicts in plotly.js's own schema ({"data": [traces], "layout": {...}}) rather
than plotly.graph_objects: a graph object validates and deep-copies every point, which is most
of a page's work with 40 stacked series (bench/dashboard.py).
tests/dashboards/test_dashboard_pages.py checks that each figure is still one that
plotly.graph_objects accepts.

History is drawn in steps. A sample stands for the time since the sample before it, so a
point (a display bucket, the average of its samples) holds its value from where the point
before it ended up to its own last sample (its `since` and `until`: dashboards.selectors).
Each x is where a step begins (line shape "hv"), and the newest step gets a point at its end.
A run of steps begins at its first sample, so a young system's chart has nothing before its
first sample: no line, no fill, no zero. A gap in the history breaks the lines (a stacked area
drops to zero across it)."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import plotly.colors
import plotly.io

from dashboards.selectors import (
    ClusterPoint,
    GpuTypeNow,
    LendingFlows,
    PreemptionEvent,
    QueueEntry,
    ShareTotalPoint,
    UsagePoint,
)

Figure = dict  # {"data": [trace dicts], "layout": layout dict}, as plotly.js takes them

# Roles on a share's chart (its own use is drawn in the share's colour).
COLOURS = {
    "capacity": "#222222",
    "in_use": "#1f77b4",
    "outside": "#8c564b",
    "down": "#d62728",
    "idle_lendable": "#2ca02c",
    "limit": "#222222",
    "lent": "#4a9a4a",
    "borrowed": "#ff7f0e",
    "demand": "#9467bd",
    "preempted": "#d62728",
    "reclaimed": "#17becf",
    "change": "#7f7f7f",
    "free_pool": "#bbbbbb",
}
CONFIG = {"displaylogo": False, "responsive": True}
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


# Distinct, saturated colours for shares: Plotly's Dark24 without its near-black (the capacity
# and limit lines are black).
SHARE_PALETTE = tuple(c for c in plotly.colors.qualitative.Dark24 if c != "#222A2A")


def share_colour(name: str) -> str:
    """A share's colour on every page: picked from SHARE_PALETTE by a hash of its name (stable
    across processes and releases, unlike Python's hash())."""
    digest = hashlib.sha256(name.encode()).digest()
    return SHARE_PALETTE[int.from_bytes(digest[:4], "big") % len(SHARE_PALETTE)]


@functools.cache
def _template(name: str) -> dict:
    """A named plotly template as the dict plotly.js takes (plotly.js knows no names)."""
    return plotly.io.templates[name].to_plotly_json()


def _layout(title: str, y_title: str, *, x_title: str = "time (UTC)", height: int = 360) -> dict:
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 90},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.3, "traceorder": "normal"},
        "hovermode": "x unified",
        "template": _template("plotly_white"),
    }


def to_html(fig: Figure, div_id: str) -> str:
    """The figure as a <div> and the script that draws it with our own plotly.js."""
    return plotly.io.to_html(
        fig, include_plotlyjs=False, full_html=False, div_id=div_id, config=CONFIG, validate=False
    )


@functools.lru_cache(maxsize=4096)
def _time(at: datetime) -> str:
    # Every series of a chart shares its buckets: format each instant once. Where a step
    # begins or ends at a sample, it is that sample's time to the microsecond.
    return at.strftime(TIME_FORMAT + ".%f" if at.microsecond else TIME_FORMAT)


def _span(point: UsagePoint | ShareTotalPoint | ClusterPoint) -> tuple[datetime, datetime]:
    """The time a history point is drawn over: its since and until, or, where it does not say,
    its bucket's start and `seconds` after."""
    if point.since is None or point.until is None:
        return point.at, point.at + timedelta(seconds=point.seconds)
    return point.since, point.until


def _steps(spans: Sequence[tuple[datetime, datetime]]) -> tuple[list[str], list[int | None]]:
    """The x values of a step chart (line shape "hv") of buckets drawn over `spans` (since,
    until; oldest first), and for each x the bucket whose value it carries: each bucket holds
    its value from its since to the next bucket's, the last of a run of touching buckets to
    its until, and a None breaks the line where the history has a gap (a stacked area drops to
    zero there). No x lies before the first bucket's since."""
    x: list[str] = []
    bucket: list[int | None] = []
    for i, (since, until) in enumerate(spans):
        if i and spans[i - 1][1] < since:
            x.append(_time(spans[i - 1][1]))
            bucket.append(None)
        x.append(_time(since))
        bucket.append(i)
        if i + 1 == len(spans) or until < spans[i + 1][0]:
            x.append(_time(until))
            bucket.append(i)
    return x, bucket


def _on_steps(bucket: list[int | None], values: Sequence[float]) -> list[float | None]:
    """A series' values at the x values that _steps gave."""
    return [None if i is None else values[i] for i in bucket]


def capacity_now(rows: list[GpuTypeNow]) -> Figure:
    """Grouped bars per GPU type: capacity, in use, used outside the portal, idle lendable,
    down. GPUs used outside the portal are not capacity: their own bar shows a lead why
    capacity shrank. A cluster where no GPU is used outside the portal (only node agents, or
    a cluster manager running nothing of its own) has no such bar."""
    types = [r.gpu_type for r in rows]
    layout = _layout("GPUs now, per GPU type", "GPUs", x_title="GPU type")
    layout.update(barmode="group", hovermode="closest")
    bars = [("capacity (nodes up)", "capacity"), ("in use", "in_use")]
    if any(r.outside for r in rows):
        bars.append(("used outside the portal", "outside"))
    bars += [("idle, lendable", "idle_lendable"), ("down", "down")]
    data = [
        {"type": "bar", "name": name, "x": types, "y": [getattr(r, key) for r in rows],
         "marker": {"color": COLOURS[key]}}
        for name, key in bars
    ]  # fmt: skip
    return {"data": data, "layout": layout}


def stacked_usage(
    gpu_type: str, points: list[ShareTotalPoint], cluster: list[ClusterPoint], range_label: str
) -> Figure:
    """GPUs of one type in use over time, stacked by share, under the cluster's capacity."""
    instants = sorted({p.at for p in points})
    column = {at: i for i, at in enumerate(instants)}
    # The shares stack on the same steps: the selector gives every share's point of a bucket
    # the bucket's span.
    spans: dict[datetime, tuple[datetime, datetime]] = {}
    by_share: dict[str, list[float]] = {}
    for p in points:
        values = by_share.get(p.share)
        if values is None:
            values = by_share[p.share] = [0] * len(instants)
        values[column[p.at]] = p.usage
        if p.at not in spans:
            spans[p.at] = _span(p)
    x, bucket = _steps([spans[at] for at in instants])
    data = [
        {
            "type": "scatter",
            "name": share,
            "x": x,
            "y": _on_steps(bucket, [round(v, 3) for v in by_share[share]]),
            "mode": "lines",
            "stackgroup": "usage",
            "line": {"width": 0.5, "color": share_colour(share), "shape": "hv"},
            "hovertemplate": "%{y:.1f}",
        }
        for share in sorted(by_share)
    ]
    if cluster:
        x, bucket = _steps([_span(c) for c in cluster])
        data.append(
            {
                "type": "scatter",
                "name": "capacity",
                "x": x,
                "y": _on_steps(bucket, [c.capacity for c in cluster]),
                "mode": "lines",
                "line": {"color": COLOURS["capacity"], "dash": "dash", "width": 1.5, "shape": "hv"},
            }
        )
    title = f"{gpu_type}: GPUs in use by share ({range_label})"
    return {"data": data, "layout": _layout(title, f"{gpu_type} GPUs")}


def share_usage(
    share: str,
    gpu_type: str,
    points: list[UsagePoint],
    preemptions: list[PreemptionEvent],
    changes: list[dict],
    range_label: str,
) -> Figure:
    """One share's GPUs of one type: own use (share colour), lent to others (up to the limit),
    borrowed (above the limit), the limit, runnable demand, and markers for preemptions and
    share changes."""
    x, bucket = _steps([_span(p) for p in points])
    data = []
    # Lent and borrowed bands are hatched, so they read apart from any share's colour.
    for name, values, colour, pattern in (
        ("own use (within limit)", [p.own for p in points], share_colour(share), ""),
        ("lent to others", [p.lent for p in points], COLOURS["lent"], "/"),
        ("borrowed (above limit)", [p.borrowed for p in points], COLOURS["borrowed"], "x"),
    ):
        trace = {
            "type": "scatter", "name": name, "x": x, "y": _on_steps(bucket, values),
            "mode": "lines", "stackgroup": "share",
            "line": {"width": 0.5, "color": colour, "shape": "hv"}, "hovertemplate": "%{y:.1f}",
        }  # fmt: skip
        if pattern:
            trace["fillpattern"] = {"shape": pattern, "fgcolor": colour, "solidity": 0.4}
        data.append(trace)
    data.append({
        "type": "scatter", "name": "limit", "x": x,
        "y": _on_steps(bucket, [p.limit for p in points]), "mode": "lines",
        "line": {"color": COLOURS["limit"], "dash": "dash", "width": 1.5, "shape": "hv"},
    })  # fmt: skip
    data.append({
        "type": "scatter", "name": "runnable demand", "x": x,
        "y": _on_steps(bucket, [p.demand for p in points]), "mode": "lines",
        "line": {"color": COLOURS["demand"], "dash": "dot", "width": 2, "shape": "hv"},
    })  # fmt: skip
    top = max([p.limit + p.borrowed for p in points] or [1])
    of_type = [e for e in preemptions if e.gpu_type == gpu_type]
    victims = [e for e in of_type if e.share == share]
    reclaims = [e for e in of_type if e.for_share == share and e.share != share]
    for name, events, colour, symbol in (
        ("preempted (its jobs)", victims, COLOURS["preempted"], "x"),
        ("reclaimed (for its jobs)", reclaims, COLOURS["reclaimed"], "triangle-up"),
    ):
        data.append(
            {
                "type": "scatter",
                "name": name,
                "x": [_time(e.at) for e in events],
                "y": [top * 1.05] * len(events),
                "mode": "markers",
                "marker": {"color": colour, "symbol": symbol, "size": 11},
                "text": [e.text for e in events],
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    data.append(
        {
            "type": "scatter",
            "name": "share changed",
            "x": [_time(c["at"]) for c in changes],
            "y": [top * 1.12] * len(changes),
            "mode": "markers",
            "marker": {"color": COLOURS["change"], "symbol": "diamond", "size": 10},
            "text": [f"{c['by']}: " + "<br>".join(c["fields"]) for c in changes],
            "hovertemplate": "%{text}<extra></extra>",
        }
    )
    layout = _layout(f"Share {share}: {gpu_type} GPUs ({range_label})", f"{gpu_type} GPUs")
    layout["hovermode"] = "closest"
    return {"data": data, "layout": layout}


def lending_bars(team: str, flows: LendingFlows, range_label: str) -> Figure:
    """Horizontal bars: GPU-hours the team lent to each borrower, and borrowed from each
    lender (or the free pool)."""
    layout = _layout(
        f"Team {team}: lending and borrowing, GPU-hours ({range_label}, approximate)",
        "",
        x_title="GPU-hours",
        height=320,
    )
    layout.update(hovermode="closest")
    layout["yaxis"] = {"rangemode": "tozero", "automargin": True}  # the bars are labelled
    data = [
        {
            "type": "bar",
            "name": "lent to (borrowers)",
            "y": [f"lent to {s}" for s in flows.lent_to],
            "x": list(flows.lent_to.values()),
            "orientation": "h",
            "marker": {"color": [share_colour(s) for s in flows.lent_to]},
        },
        {
            "type": "bar",
            "name": "borrowed from (lenders)",
            "y": [f"borrowed from {s}" for s in flows.borrowed_from],
            "x": list(flows.borrowed_from.values()),
            "orientation": "h",
            "marker": {
                "color": [
                    COLOURS["free_pool"] if s == "free pool" else share_colour(s)
                    for s in flows.borrowed_from
                ],
                "pattern": {"shape": "/"},
            },
        },
    ]
    return {"data": data, "layout": layout}


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 × 10^k that is at least `raw` (bins a person can read)."""
    if raw <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def wait_histogram(team: str, waits: Mapping[str, list[float]], range_label: str) -> Figure:
    """How long the team's jobs waited from submission to first start, per share."""
    layout = _layout(
        f"Team {team}: wait before first start ({range_label})",
        "jobs",
        x_title="wait (minutes)",
        height=320,
    )
    layout.update(barmode="stack", hovermode="closest")
    longest = max((max(v) for v in waits.values() if v), default=0.0)
    bins = {"start": 0, "size": _nice_step(longest / 20)}
    data = [
        {"type": "histogram", "name": share, "x": waits[share],
         "marker": {"color": share_colour(share)}, "opacity": 0.85, "xbins": bins,
         "bingroup": "waits"}
        for share in sorted(waits)
    ]  # fmt: skip
    return {"data": data, "layout": layout}


def queue_gantt(
    gpu_type: str, entries: Sequence[QueueEntry], now: datetime, hours: float
) -> Figure:
    """The next `hours` of one GPU type's queue: a bar per waiting job with an estimate, from
    its estimated start for its expected run time, in the queue's order, coloured by share."""
    until = now + timedelta(hours=hours)
    shown = [
        entry
        for entry in entries
        if entry.gpu_type == gpu_type and entry.estimated_start and entry.estimated_start < until
    ]
    layout = _layout(
        f"{gpu_type}: the next {hours:g} hours of the queue (estimated, no new job assumed)",
        "",
        height=max(220, 60 + 22 * len(shown)),
    )
    layout["yaxis"] = {"autorange": "reversed", "automargin": True, "type": "category"}
    layout["xaxis"] = {"type": "date", "range": [_time(now), _time(until)],
                       "title": {"text": "time (UTC)"}}  # fmt: skip
    layout["hovermode"] = "closest"
    layout["showlegend"] = False
    labels = [f"#{e.position} job {e.job_id} ({e.share}, {e.gpus} GPUs)" for e in shown]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "estimated run",
            "y": labels,
            "base": [_time(e.estimated_start) for e in shown],
            "x": [1000 * (e.expected_seconds or 0) for e in shown],  # ms on a date axis
            "marker": {"color": [share_colour(e.share) for e in shown]},
            "hovertext": [
                f"job {e.job_id} of share {e.share}: starts {_time(e.estimated_start)}, "
                f"runs about {(e.expected_seconds or 0) / 60:.0f} min"
                for e in shown
            ],
            "hoverinfo": "text",
        }
    ]
    return {"data": data, "layout": layout}
