"""Odd requests to the dashboards, the chargeback export and the notifications: each test
names a behaviour a user relies on, and fails where the portal does not keep it.

The project's rules: bad input is a clear 4xx (on an HTML page, the page with a message)
naming the field and the rule, never a 500; what is accepted is not lost; every page and
export gives correct figures."""

from __future__ import annotations

import csv
import io
from urllib.parse import quote

import pytest

from notifications.models import Delivery, Kind
from notifications.services import dispatch
from shares.models import ShareChange
from shares.services import share_create, share_update
from tests.conftest import create_team

# The notifications' real HTTP receiver (and their short timeouts), as their tests use them.
from tests.notifications.conftest import (  # noqa: F401
    loopback_allowed,
    quick_notifications,
    receiver,
)

pytestmark = pytest.mark.django_db

TOO_LARGE = 2**63  # one past the database's largest integer (SQLite's and PostgreSQL's bigint)
SUBSCRIPTIONS = "/api/v1/notifications/subscriptions/"


# --- Job pages: an id the database cannot hold is a job that does not exist -------------------


@pytest.mark.parametrize(
    "method, path, data",
    [
        ("get", f"/dash/jobs/{TOO_LARGE}/", None),
        ("post", f"/dash/jobs/{TOO_LARGE}/cancel/", {}),
        ("post", f"/dash/jobs/{TOO_LARGE}/priority/", {"priority": "1"}),
        ("get", "/dash/jobs/99999999999999999999999/", None),
    ],
)
def test_a_job_page_for_an_id_too_large_for_the_database_is_not_found(
    client, world, method, path, data
):
    """Such an id names no job: 404, as the API's `jobs/<id>/` answers, for the job's page and
    its cancel and priority buttons alike (asking the database for it raised OverflowError, a
    500)."""
    client.raise_request_exception = False
    client.force_login(world.alice)
    response = getattr(client, method)(path, data)
    assert response.status_code == 404, response.status_code


# --- Custom ranges with a UTC offset ----------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        "range=custom&start=0001-01-01T00:00%2B01:00&end=2026-01-01T00:00",
        "range=custom&start=2026-01-01T00:00&end=9999-12-31T23:59-05:00",
    ],
)
def test_a_custom_range_beyond_what_a_date_can_hold_is_refused_with_a_message(
    client, world, params
):
    """`fromisoformat` accepts these, but in UTC they lie outside year 1..9999. Like any bad
    custom range, the page says so and falls back to the last 24 hours (it was a 500)."""
    client.raise_request_exception = False
    client.force_login(world.root)
    response = client.get(f"/dash/?{params}")
    assert response.status_code in (200, 400), response.status_code
    assert "custom range" in response.content.decode()


def test_a_custom_range_with_an_offset_is_labelled_and_linked_in_utc(client, world):
    """start=2026-01-01T00:00+05:00 is 2025-12-31 19:00 UTC. The pages' range is UTC
    (docs/dashboards.md): the label and the links to the other pages give it in UTC, as the
    chargeback links do, not the offset's local time (a range five hours off)."""
    client.force_login(world.carol)
    start, end = quote("2026-01-01T00:00+05:00"), quote("2026-01-01T06:00+05:00")
    html = client.get(f"/dash/teams/vision/?range=custom&start={start}&end={end}").content.decode()
    assert "start=2025-12-31T19%3A00%3A00" in html  # the chargeback link: converted to UTC
    refused = "custom range" in html
    assert refused or "2025-12-31 19:00 – 2026-01-01 01:00 UTC" in html
    assert "2026-01-01 00:00 – 2026-01-01 06:00 UTC" not in html  # not UTC


# --- The chargeback export --------------------------------------------------------------------


def test_a_chargeback_in_an_unknown_format_is_a_400_naming_format(world):
    """docs/chargeback.md: `format` is json or csv, and every bad request is a 400 naming the
    field and the rule (format=xml was DRF's bare 404 "Not found.")."""
    response = world.client("root").get(
        "/api/v1/chargeback/", {"month": "2025-11", "format": "xml"}
    )
    assert response.status_code == 400, (response.status_code, response.content)
    assert "format" in response.json()


def test_a_chargeback_csv_has_no_cell_a_spreadsheet_reads_as_a_formula(world):
    """A share's name is a slug, and a slug may start with '-': as the bare cell -2-3 a
    spreadsheet would evaluate it (-5), the CSV injection OWASP describes (cells starting with
    = + - @ must be escaped). The download is meant for spreadsheets (docs/chargeback.md); a
    share's name must come back as its name."""
    share_create(
        name="-2-3", team=create_team("vision"), capacity_limits={"h100": 1},
        source=ShareChange.Source.COMMAND,
    )  # fmt: skip
    response = world.client("root").get(
        "/api/v1/chargeback/", {"month": "2025-11", "format": "csv"}
    )
    assert response.status_code == 200, response.content
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    names = [row["share"] for row in rows]
    assert any("2-3" in name for name in names), names
    assert not [n for n in names if n[:1] in ("=", "+", "-", "@", "\t", "\r")], names


# --- Webhook targets: what the portal checks is what it posts to -------------------------------


def _subscribe(world, target: str):
    return world.client("alice").post(
        SUBSCRIPTIONS,
        {"scope": "share", "share": "research", "kinds": [Kind.SHARE_CHANGED],
         "channel": "webhook", "target": target},
        format="json",
    )  # fmt: skip


def test_a_webhook_target_the_portal_accepts_is_one_it_can_post_to(world, receiver):  # noqa: F811
    """A tab inside the host: urlsplit drops it, so a check by urlsplit sees 127.0.0.1 (allowed
    here), but requests refuses the URL at every send (InvalidURL): accepted, then lost. The
    target is refused (400 naming `target`) or delivered to."""
    url = receiver.url("/hook")
    tabbed = url.replace("127.0.0.1", "127.0.0.\t1")
    answer = _subscribe(world, tabbed)
    if answer.status_code == 400:
        assert "target" in answer.json()
        return
    assert answer.status_code == 201, answer.content
    share_update(share=world.research, actor=world.root, source="api", grace_seconds=60)
    dispatch()
    delivery = Delivery.objects.get()
    assert [r.path for r in receiver.requests] == ["/hook"], delivery.last_error


def test_a_webhook_whose_url_reaches_a_private_host_is_refused_when_subscribing(world):
    """http://10.0.0.1\\@93.184.215.14/hook: urlsplit reads the host as 93.184.215.14 (public);
    requests (urllib3, as WHATWG URL parsing) reads it as 10.0.0.1, a private address. The
    target is checked as the sender reads it: a 400 on `target`."""
    answer = _subscribe(world, "http://10.0.0.1\\@93.184.215.14/hook")
    assert answer.status_code == 400, answer.content
    assert "target" in answer.json()


def test_a_webhook_port_outside_1_to_65535_is_a_400_on_target(world):
    """The rule (notifications.targets.PORT_INVALID): a port is a number from 1 to 65535. Port 0
    must not pass as "no port" (443 checked, and posted to: an address the user never gave)."""
    answer = _subscribe(world, "https://93.184.215.14:0/hook")
    assert answer.status_code == 400, answer.content
    assert "target" in answer.json()
