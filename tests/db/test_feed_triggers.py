"""The cycle keeps its snapshot between cycles only while every trigger of the change feed is in
place (scheduler/cycle/snapshot.py); without them it reads the whole queue in every cycle. On
SQLite a migration that rebuilds the job or attempt table drops that table's triggers, so the
migrations are run here on a new SQLite database, whatever database the suite runs on."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from scheduler.cycle.snapshot import FEED_TRIGGERS, snapshot_cache

ROOT = Path(__file__).resolve().parents[2]


def test_the_migrations_leave_every_feed_trigger_on_sqlite(tmp_path):
    database = tmp_path / "portal.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    with sqlite3.connect(database) as db:
        triggers = {name for (name,) in db.execute("SELECT name FROM sqlite_master "
                                                    "WHERE type = 'trigger'")}  # fmt: skip
    assert set(FEED_TRIGGERS["sqlite"]) <= triggers


@pytest.mark.django_db
def test_the_test_database_has_every_feed_trigger():
    _token, complete = snapshot_cache._feed_state()
    assert connection.vendor in FEED_TRIGGERS and complete
