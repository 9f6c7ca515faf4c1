"""`GET /api/v1/chargeback/`: who sees whose chargeback, the range's rules (a 400 naming the
field and the rule), JSON and CSV, and the endpoint in the OpenAPI schema."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from dashboards.chargeback import (
    COLUMNS,
    END_NOT_AFTER_START,
    MAX_DAYS,
    MONTH_INVALID,
    MONTH_WITH_RANGE,
    PER_INVALID,
    RANGE_TOO_LONG,
    SHARE_NOT_VISIBLE,
    TEAM_NOT_VISIBLE,
    TIME_INVALID,
    TIME_OUT_OF_BOUNDS,
    TIME_REQUIRED,
)
from tests.chargeback.conftest import DECEMBER, HOUR, preempted_attempt

URL = "/api/v1/chargeback/"
ANON = None


def get(world, persona, **params):
    return world.client(persona).get(URL, params)


def rows_by_key(response) -> dict[tuple[str, str], dict]:
    assert response.status_code == 200, response.content
    return {(r["share"], r["gpu_type"]): r for r in response.json()["rows"]}


# --- Who sees whose chargeback ----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "persona, status",
    [("root", 200), ("carol", 200), ("alice", 200), ("bob", 403), ("oscar", 403), (ANON, 401)],
)
def test_leads_and_admins_read_chargebacks_members_and_outsiders_do_not(november, persona, status):
    """As on the dashboards: a team's bill is its lead's business. bob, a plain member of
    ml-research, and oscar, on no team, get 403 with the rule; anonymous 401."""
    response = get(november, persona, month="2025-11")
    assert response.status_code == status, response.content
    if status == 403:
        assert response.json()["detail"].startswith("chargeback: only team leads")


@pytest.mark.django_db
def test_a_lead_sees_their_teams_shares_only_and_an_admin_every_share(november):
    """carol sees vision, alice research (both GPU types); root sees both, and a share deleted
    since that the history still knows, with no team."""
    assert set(rows_by_key(get(november, "carol", month="2025-11"))) == {("vision", "h100")}
    assert set(rows_by_key(get(november, "alice", month="2025-11"))) == {
        ("research", "h100"), ("research", "l4"),
    }  # fmt: skip
    everything = rows_by_key(get(november, "root", month="2025-11"))
    assert set(everything) == {
        ("gone", "h100"), ("research", "h100"), ("research", "l4"), ("vision", "h100"),
    }  # fmt: skip
    assert everything[("gone", "h100")]["team"] == ""
    assert everything[("research", "h100")]["team"] == "ml-research"


@pytest.mark.django_db
def test_a_lead_asking_for_another_teams_chargeback_gets_404_naming_the_field(november):
    response = get(november, "carol", month="2025-11", team="ml-research")
    assert response.status_code == 404
    assert response.json() == {"team": [TEAM_NOT_VISIBLE.format(slug="ml-research")]}
    response = get(november, "carol", month="2025-11", share="research")
    assert response.status_code == 404
    assert response.json() == {"share": [SHARE_NOT_VISIBLE.format(name="research")]}


@pytest.mark.django_db
def test_team_and_share_narrow_an_admins_chargeback(november):
    assert set(rows_by_key(get(november, "root", month="2025-11", team="vision"))) == {
        ("vision", "h100")
    }
    assert set(rows_by_key(get(november, "root", month="2025-11", share="gone"))) == {
        ("gone", "h100")
    }
    response = get(november, "root", month="2025-11", team="vision", share="research")
    assert response.status_code == 404


# --- What it says -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_months_chargeback_counts_use_borrowing_lending_and_preemption(november):
    """November as the `november` fixture tells it, in GPU-hours."""
    body = get(november, "root", month="2025-11").json()
    assert (body["start"], body["end"], body["timezone"], body["per"]) == (
        "2025-11-01T00:00:00Z", "2025-12-01T00:00:00Z", "UTC", "range",
    )  # fmt: skip
    rows = {(r["share"], r["gpu_type"]): r for r in body["rows"]}
    research, vision = rows[("research", "h100")], rows[("vision", "h100")]
    assert research["resolution"] == "hour"
    assert (research["sampled_hours"], research["quota_gpu_hours"]) == (15, 120)
    assert (research["own_gpu_hours"], research["borrowed_gpu_hours"]) == (120, 20)
    assert (research["used_gpu_hours"], research["lent_gpu_hours"]) == (140, 0)
    assert (research["lost_gpu_hours"], research["reclaimed_from_gpu_hours"]) == (2, 2)
    assert (research["preemptions"], research["reclaims_from"]) == (1, 1)
    assert (vision["lent_gpu_hours"], vision["reclaimed_for_gpu_hours"]) == (20, 2)
    assert (vision["reclaims_for"], vision["lost_gpu_hours"]) == (1, 0)
    assert rows[("research", "l4")]["quota_gpu_hours"] == 30
    # What lenders reclaimed from borrowers is what borrowers had reclaimed from them.
    assert sum(r["reclaimed_from_gpu_hours"] for r in rows.values()) == sum(
        r["reclaimed_for_gpu_hours"] for r in rows.values()
    )


@pytest.mark.django_db
def test_work_lost_runs_from_the_last_checkpoint_or_the_start_and_only_reclaims_are_reclaimed(
    world,
):
    """In research, in December 2025: an in-share preemption of a job with no checkpoint
    (2 GPUs × 3 h since its start) is lost but not reclaimed; an attempt stopped before it
    started lost nothing; a reclaim for vision after a checkpoint 15 minutes before the end
    (8 GPUs × 15 min) is both."""
    at = DECEMBER + timedelta(days=2)
    preempted_attempt(world.research, world.research, world.bob, gpus=2, started=at,
                      checkpoint=None, ended=at + 3 * HOUR)  # fmt: skip
    preempted_attempt(world.research, world.vision, world.bob, gpus=4, started=None,
                      checkpoint=None, ended=at + 4 * HOUR)  # fmt: skip
    preempted_attempt(world.research, world.vision, world.bob, gpus=8, started=at,
                      checkpoint=at + 4.75 * HOUR, ended=at + 5 * HOUR)  # fmt: skip
    rows = rows_by_key(get(world, "root", month="2025-12"))
    research, vision = rows[("research", "h100")], rows[("vision", "h100")]
    assert (research["preemptions"], research["reclaims_from"]) == (3, 2)
    assert (research["lost_gpu_hours"], research["reclaimed_from_gpu_hours"]) == (8, 2)
    assert (vision["reclaims_for"], vision["reclaimed_for_gpu_hours"]) == (2, 2)
    assert research["reclaims_for"] == 0  # an in-share preemption is no reclaim


@pytest.mark.django_db
def test_a_range_outside_the_history_still_lists_a_leads_shares_with_zeros(november):
    rows = rows_by_key(get(november, "alice", start="2025-09-01", end="2025-09-02"))
    assert set(rows) == {("research", "h100"), ("research", "l4")}
    assert all(r["used_gpu_hours"] == 0 and r["sampled_hours"] == 0 for r in rows.values())


@pytest.mark.django_db
def test_per_month_cuts_the_range_at_each_first_of_a_month(november):
    body = get(november, "root", start="2025-10-15", end="2025-12-10", per="month").json()
    periods = sorted({(r["period_start"], r["period_end"]) for r in body["rows"]})
    assert periods == [
        ("2025-10-15T00:00:00Z", "2025-11-01T00:00:00Z"),
        ("2025-11-01T00:00:00Z", "2025-12-01T00:00:00Z"),
        ("2025-12-01T00:00:00Z", "2025-12-10T00:00:00Z"),
    ]
    research = [r for r in body["rows"] if (r["share"], r["gpu_type"]) == ("research", "h100")]
    assert [r["used_gpu_hours"] for r in research] == [0, 140, 0]


@pytest.mark.django_db
def test_times_are_utc_and_an_offset_is_converted(november):
    """2025-11-01T02:00+02:00 is midnight UTC; the + is URL-encoded as %2B by the client."""
    body = get(november, "root", start="2025-11-01T02:00+02:00", end="2025-12-01T00:00Z").json()
    assert (body["start"], body["end"]) == ("2025-11-01T00:00:00Z", "2025-12-01T00:00:00Z")
    assert body == get(november, "root", month="2025-11").json()


# --- The range's rules ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params, field, message",
    [
        ({"start": "yesterday", "end": "2025-12-01"}, "start",
         TIME_INVALID.format(field="start", value="yesterday")),
        ({"start": "2025-02-30", "end": "2025-12-01"}, "start",
         TIME_INVALID.format(field="start", value="2025-02-30")),
        ({"start": "2025-11-01", "end": "2025-11-01T24:00"}, "end",
         TIME_INVALID.format(field="end", value="2025-11-01T24:00")),
        ({"start": "1999-12-31", "end": "2000-01-02"}, "start",
         TIME_OUT_OF_BOUNDS.format(field="start", value="1999-12-31")),
        ({"end": "2025-12-01"}, "start", TIME_REQUIRED.format(field="start")),
        ({"start": "2025-11-01"}, "end", TIME_REQUIRED.format(field="end")),
        ({"start": "2025-12-01", "end": "2025-11-01"}, "end", END_NOT_AFTER_START),
        ({"start": "2025-11-01", "end": "2025-11-01"}, "end", END_NOT_AFTER_START),
        ({"start": "2025-01-01", "end": "2026-01-03"}, "end", RANGE_TOO_LONG.format(days=367)),
        ({"month": "2025-13"}, "month", MONTH_INVALID.format(value="2025-13")),
        ({"month": "November"}, "month", MONTH_INVALID.format(value="November")),
        ({"month": "2025-11", "start": "2025-11-01"}, "month", MONTH_WITH_RANGE),
        ({"month": "2025-11", "per": "week"}, "per", PER_INVALID),
    ],
)  # fmt: skip
def test_a_bad_range_is_a_400_naming_the_field_and_the_rule(world, params, field, message):
    response = get(world, "alice", **params)
    assert response.status_code == 400, response.content
    assert response.json()[field] == [message]


@pytest.mark.django_db
def test_a_bad_range_is_a_json_400_also_when_csv_was_asked_for(world):
    response = get(world, "alice", start="2025-12-01", end="2025-11-01", format="csv")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"end": [END_NOT_AFTER_START]}


@pytest.mark.django_db
def test_a_range_of_the_longest_length_is_accepted(world):
    assert MAX_DAYS == 366
    assert get(world, "alice", start="2024-01-01", end="2025-01-01").status_code == 200


# --- CSV --------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["format", "accept"])
def test_csv_has_a_header_row_and_the_same_rows_as_json(november, how):
    client = november.client("root")
    if how == "format":
        response = client.get(URL, {"month": "2025-11", "format": "csv"})
    else:
        response = client.get(URL, {"month": "2025-11"}, HTTP_ACCEPT="text/csv")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="chargeback-2025-11-01T00-00Z--2025-12-01T00-00Z.csv"'
    )
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert tuple(lines[0]) == COLUMNS
    as_json = client.get(URL, {"month": "2025-11"}).json()["rows"]
    assert len(lines) == 1 + len(as_json)
    for line, row in zip(lines[1:], as_json, strict=True):
        assert line == [str(row[column]) for column in COLUMNS]


# --- The schema -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_schema_describes_the_chargeback_endpoint(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/chargeback/"]["get"]
    assert operation["operationId"] == "chargeback"
    assert {p["name"] for p in operation["parameters"]} >= {
        "start", "end", "month", "per", "team", "share", "format",
    }  # fmt: skip
    ok = operation["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/csv"}
    assert ok["text/csv"]["schema"]["type"] == "string"
    row = schema["components"]["schemas"]["ChargebackRow"]
    assert tuple(row["properties"]) == COLUMNS
    assert set(operation["responses"]) >= {"200", "400", "401", "403", "404"}
