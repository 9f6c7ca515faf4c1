"""The notifications' Celery task: thin, it calls the dispatch."""

from celery import Celery, shared_task
from django.conf import settings

from notifications import services


@shared_task(name="notifications.tasks.dispatch", ignore_result=True)
def dispatch() -> None:
    """New events become deliveries; the due deliveries are sent (skipped while another
    dispatch runs)."""
    if settings.NOTIFICATIONS_ENABLED:
        services.dispatch()


def add_periodic_tasks(app: Celery) -> None:
    """Beat dispatches every NOTIFICATIONS_POLL_SECONDS, on NOTIFICATIONS_QUEUE if one is set."""
    options = {"queue": settings.NOTIFICATIONS_QUEUE} if settings.NOTIFICATIONS_QUEUE else {}
    app.add_periodic_task(
        settings.NOTIFICATIONS_POLL_SECONDS,
        app.signature("notifications.tasks.dispatch", options=options),
        name="notifications_dispatch",
    )
