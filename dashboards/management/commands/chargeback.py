"""`manage.py chargeback --from 2026-11-01 --to 2026-12-01 [--format csv|json]`: the operator's
chargeback of every share (or one team's, one share's), as the API's (docs/chargeback.md)."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from dashboards import chargeback


class Command(BaseCommand):
    help = (
        "GPU-hours per share and GPU type over [--from, --to) UTC, or a --month: used on own "
        "quota, borrowed, lent, reclaimed, lost to preemption (docs/chargeback.md)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--from", dest="start", help="Start, included: YYYY-MM-DD[THH:MM].")
        parser.add_argument("--to", dest="end", help="End, excluded: YYYY-MM-DD[THH:MM].")
        parser.add_argument("--month", help="YYYY-MM, instead of --from and --to.")
        parser.add_argument("--per", choices=chargeback.PER_CHOICES, default=chargeback.PER_RANGE)
        parser.add_argument("--team", default="", help="Only this team's shares (its slug).")
        parser.add_argument("--share", default="", help="Only this share.")
        parser.add_argument("--format", choices=chargeback.FORMATS, default="csv")
        parser.add_argument("--output", help="Write to this file instead of standard output.")

    def handle(self, *args, **options) -> None:
        try:
            wanted = chargeback.chargeback_request(
                start=options["start"],
                end=options["end"],
                month=options["month"],
                per=options["per"],
            )
            names = chargeback.chargeback_shares(None, team=options["team"], share=options["share"])
        except ValidationError as invalid:
            # The API's messages, with the command's option names where they differ.
            lines = [m for messages in invalid.message_dict.values() for m in messages]
            text = "\n".join(_option_names(line) for line in lines)
            raise CommandError(text) from None
        except chargeback.NotVisible as hidden:
            raise CommandError(str(hidden)) from None
        rows = chargeback.chargeback(wanted, shares=names)
        document = chargeback.report(wanted, rows)
        if options["format"] == "json":
            text = json.dumps(document, indent=2) + "\n"
        else:
            text = chargeback.rows_csv(document["rows"])
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8", newline="") as out:
                out.write(text)
            self.stderr.write(f"wrote {len(rows)} rows to {options['output']}")
        else:
            self.stdout.write(text, ending="")


def _option_names(message: str) -> str:
    for field, option in (("start", "--from"), ("end", "--to"), ("month", "--month")):
        if message.startswith(f"{field}:"):
            return option + message[len(field) :]
    return message
