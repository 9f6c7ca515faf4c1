from django.apps import AppConfig


class SharesConfig(AppConfig):
    name = "shares"
    verbose_name = "Teams and quota shares"
