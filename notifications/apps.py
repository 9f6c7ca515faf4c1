from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from notifications.targets import allowed_nets


class NotificationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        checks.register(check_allowed_nets)


def check_allowed_nets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A NOTIFICATIONS_WEBHOOK_ALLOWED_NETS that does not parse stops the portal at start,
    not at the first webhook."""
    try:
        allowed_nets()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="notifications.E001")]
    return []
