from django.apps import AppConfig


class AwsBatchConfig(AppConfig):
    name = "awsbatch"
    verbose_name = "AWS Batch API"
