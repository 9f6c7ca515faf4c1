"""`manage.py simulate SCENARIO.yaml --out RESULT.json [--plot FILE.html]`: replay a scenario
through the scheduling engine on a simulated clock, with no database and no broker."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from scheduler.simulator.cli import main


class Command(BaseCommand):
    help = __doc__

    def run_from_argv(self, argv: list[str]) -> None:
        # The simulator owns its arguments (argparse, with its own --help): pass them through.
        exit_code = main(argv[2:], stdout=sys.stdout, stderr=sys.stderr)
        if exit_code:
            sys.exit(exit_code)

    def handle(self, *args, **options) -> None:  # pragma: no cover — call_command path
        raise CommandError("run it as `python manage.py simulate SCENARIO.yaml --out RESULT.json`")
