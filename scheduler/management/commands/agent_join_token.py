"""Print the cluster's agent join token (the admin shows it under Cluster settings)."""

from django.core.management.base import BaseCommand

from scheduler.models import ClusterSettings


class Command(BaseCommand):
    help = "Print the join token node agents register with."

    def handle(self, *args, **options) -> None:
        self.stdout.write(ClusterSettings.load().agent_join_token)
