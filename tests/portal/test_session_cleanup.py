"""Expired sessions are deleted by beat's daily task, on the real database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from portal.celery import app

pytestmark = pytest.mark.django_db


def a_session(*, expired: bool) -> str:
    """A session saved by Django's database store; an expired one ended a day ago."""
    store = SessionStore()
    store["oidc_states"] = {"st": {"nonce": "n"}}  # as a login abandoned at the provider
    store.create()
    if expired:
        Session.objects.filter(pk=store.session_key).update(
            expire_date=timezone.now() - timedelta(days=1)
        )
    return store.session_key


def test_beat_clears_expired_sessions_daily_and_keeps_live_ones():
    """Nothing ran Django's clearsessions, so django_session kept every session that nobody
    logged out of, for ever. Beat's schedule has a daily task; the task (run by Celery's own
    apply) deletes the expired rows and keeps the live one."""
    assert settings.SESSION_ENGINE == "django.contrib.sessions.backends.db"
    app.loader.import_default_modules()
    app.finalize()
    app.on_after_finalize.send(sender=app)
    entry = app.conf.beat_schedule["sessions_clear_expired"]
    assert entry["task"] == "portal.tasks.sessions_clear_expired"
    assert entry["schedule"] == 24 * 60 * 60

    expired, live = a_session(expired=True), a_session(expired=False)
    app.tasks["portal.tasks.sessions_clear_expired"].apply()
    assert not Session.objects.filter(session_key=expired).exists()
    assert list(Session.objects.values_list("session_key", flat=True)) == [live]
    assert SessionStore(session_key=live).load() == {"oidc_states": {"st": {"nonce": "n"}}}
