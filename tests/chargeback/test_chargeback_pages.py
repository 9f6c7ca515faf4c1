"""The team and overview pages offer the chargeback for download: the page's range, last
month and this month, as CSV (and JSON); a lead's link is their team's, and it works with the
session they logged in with."""

from __future__ import annotations

import csv
import io
import re
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from dashboards.chargeback import COLUMNS, month_range

LINK = re.compile(r'href="(/api/v1/chargeback/\?[^"]+)"')


def links(page) -> list[str]:
    assert page.status_code == 200
    return [unescape(href) for href in LINK.findall(page.content.decode())]


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


@pytest.mark.django_db
def test_the_team_page_downloads_the_teams_chargeback_for_its_range(client, november):
    client.force_login(november.carol)
    found = links(client.get("/dash/teams/vision/?range=custom&start=2025-11-01T00:00"
                             "&end=2025-12-01T00:00"))  # fmt: skip
    assert found, "no chargeback link on the team page"
    assert all(params(url)["team"] == "vision" for url in found)
    in_range = next(url for url in found if "start" in params(url) and "csv" in url)
    assert (params(in_range)["start"], params(in_range)["end"]) == (
        "2025-11-01T00:00:00", "2025-12-01T00:00:00",
    )  # fmt: skip
    download = client.get(in_range)
    assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")
    reader = csv.DictReader(io.StringIO(download.content.decode()))
    assert tuple(reader.fieldnames) == COLUMNS
    assert [row["share"] for row in reader] == ["vision"]


@pytest.mark.django_db
def test_the_overview_downloads_last_and_this_months_chargeback(client, november):
    client.force_login(november.root)
    found = links(client.get("/dash/"))
    this_month, _ = month_range(timezone.now())
    months = {params(url).get("month") for url in found}
    assert f"{this_month:%Y-%m}" in months and len(months - {None}) == 2
    assert not any("team" in params(url) for url in found)
    for url in found:
        assert client.get(url).status_code == 200, url
