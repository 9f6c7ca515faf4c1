"""What the documents tell a user is true of the code."""

from __future__ import annotations

import re

from scheduler.api import serializers as s
from tests.live import ROOT

API_MD = ROOT / "docs" / "api.md"


def test_api_md_lists_every_field_a_job_carries():
    """The sentence "A job carries `...`" of docs/api.md names the fields of the API's job."""
    text = API_MD.read_text()
    listed = re.search(r"A job carries `([^`]+)`", text).group(1)
    fields = [name.strip() for name in listed.split(",")]
    assert fields == list(s.JobSerializer.Meta.fields)
