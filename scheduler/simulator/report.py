"""What a person reads after a run: a per-share table, and a chart of lending over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.simulator.clock import SimulationResult

TABLE_COLUMNS = (
    ("share", "{:<20}", "{:<20}"),
    ("GPU-h used", "{:>11}", "{:>11.2f}"),
    ("borrowed", "{:>10}", "{:>10.2f}"),
    ("lent", "{:>10}", "{:>10.2f}"),
    ("mean wait s", "{:>12}", "{:>12.1f}"),
    ("p95 wait s", "{:>11}", "{:>11.1f}"),
    ("preempted", "{:>10}", "{:>10d}"),
)


def summary_table(data: dict[str, Any]) -> str:
    """The per-share figures of a result, then one line for the cluster, as plain text."""
    header = " ".join(fmt.format(title) for title, fmt, _ in TABLE_COLUMNS)
    lines = [header, "-" * len(header)]
    for name, share in data["shares"].items():
        values = (
            name,
            share["gpu_hours_used"],
            share["gpu_hours_borrowed"],
            share["gpu_hours_lent"],
            share["mean_wait"],
            share["p95_wait"],
            share["preemptions"],
        )
        lines.append(
            " ".join(fmt.format(v) for (_, _, fmt), v in zip(TABLE_COLUMNS, values, strict=True))
        )
    cluster = data["cluster"]
    states: dict[str, int] = {}
    for job in data["jobs"]:
        states[job["state"]] = states.get(job["state"], 0) + 1
    lines.append("-" * len(header))
    lines.append(
        f"cluster: {cluster['gpu_hours_used']:.2f} of {cluster['gpu_hours_capacity']:.2f} GPU-h "
        f"used ({cluster['utilization']:.1%}), makespan {cluster['makespan']} s; jobs: "
        + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    )
    return "\n".join(lines) + "\n"


def write_plot(result: SimulationResult, path: str | Path, *, title: str = "GPU sharing") -> None:
    """A self-contained HTML page (plotly.js inlined: the machines have no internet) showing,
    for each share, the GPUs it uses within its limit, the GPUs it borrows and the GPUs it lends."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = result.share_names
    fig = make_subplots(
        rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.06
    )
    series = result.series
    hours = [t / 3600 for t, *_ in series]
    for row, name in enumerate(names, start=1):
        i = row - 1
        for label, index, color in (
            ("own", 1, "#1f77b4"),
            ("borrowed", 2, "#ff7f0e"),
            ("lent", 3, "#2ca02c"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=hours,
                    y=[point[index][i] for point in series],
                    name=f"{name} {label}",
                    legendgroup=name,
                    line={"shape": "hv", "color": color},
                    stackgroup=f"{name}-held" if label != "lent" else None,
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="GPUs", row=row, col=1)
    fig.update_xaxes(title_text="hours", row=len(names), col=1)
    fig.update_layout(title=title, height=max(400, 260 * len(names)), hovermode="x unified")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
