"""Build small scenarios in tests without repeating the cluster each time."""

from __future__ import annotations

from typing import Any

from scheduler.simulator import parse_scenario, simulate


def run(data: dict[str, Any]) -> dict[str, Any]:
    return simulate(parse_scenario(data)).data


def events_of(result: dict[str, Any]) -> list[tuple[float, str, str]]:
    return [(e["t"], e["job"], e["type"]) for e in result["events"]]


def job(result: dict[str, Any], job_id: str) -> dict[str, Any]:
    return next(j for j in result["jobs"] if j["id"] == job_id)


def two_nodes(*shares: dict[str, Any], jobs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Two nodes of 8 h100 and the given shares and jobs."""
    return {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8, "count": 2}],
        "shares": list(shares),
        "jobs": jobs,
        **extra,
    }


def share(name: str, strategy: str, limit: int = 8, **fields: Any) -> dict[str, Any]:
    return {"name": name, "capacity_limits": {"h100": limit}, "strategy": strategy, **fields}


def h100_job(
    job_id: str, share_name: str, gpus: int, submit: float, duration: float, **fields: Any
):
    return {
        "id": job_id,
        "share": share_name,
        "gpu_type": "h100",
        "gpus": gpus,
        "submit": submit,
        "duration": duration,
        **fields,
    }
