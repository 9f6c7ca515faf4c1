"""Run once after restoring a backup, before the portal starts (docs/deploy.md, "Backups and
restore"). The restored database numbers new jobs and attempts from where the dump left off, so
without this a new job could get the id of one submitted after the dump: its CHECKPOINT_DIR
(job-J) would hold that other job's checkpoint, which it would resume from, and an agent that
ran an attempt of that id would take the new attempt for one it has already ended and never
start it."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal.db.sequences import number_after
from scheduler.models import Job, JobAttempt

# Past every id a portal gives out between a nightly dump and its restore (a million jobs).
SKIP = 1_000_000


class Command(BaseCommand):
    help = "After restoring a backup: number new jobs and attempts past any given out since it."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--skip", type=int, default=SKIP,
            help=f"how many ids past today's highest the next one is (default {SKIP:,})",
        )  # fmt: skip

    def handle(self, *args, skip: int, **options) -> None:
        if skip < 1:
            raise CommandError("--skip: must be at least 1.")
        with transaction.atomic():
            for model, what in ((Job, "job"), (JobAttempt, "attempt")):
                self.stdout.write(f"the next {what} is number {number_after(model, skip)}")
