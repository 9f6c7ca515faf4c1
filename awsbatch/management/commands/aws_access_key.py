"""`python manage.py aws_access_key USERNAME`: a new access key for the user, printed as two
lines a shell can `export` (the secret is shown this once); `--revoke KEY_ID` revokes one."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from awsbatch.keys import access_key_create, access_key_revoke
from awsbatch.models import AccessKey

NO_SUCH_USER = "no user named {username}"
NO_SUCH_KEY = "user {username} has no access key {key_id}"


class Command(BaseCommand):
    help = "Create (or revoke) an AWS-style access key to sign AWS Batch API requests with."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--description", default="", help="what the key is for")
        parser.add_argument("--revoke", metavar="KEY_ID", help="revoke this key of the user")

    def handle(self, *args, username: str, description: str, revoke: str | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(NO_SUCH_USER.format(username=username))
        if revoke:
            key = AccessKey.objects.filter(user=user, access_key_id=revoke).first()
            if key is None:
                raise CommandError(NO_SUCH_KEY.format(username=username, key_id=revoke))
            access_key_revoke(key=key)
            self.stderr.write(f"revoked {revoke}")
            return
        new = access_key_create(user=user, description=description)
        self.stdout.write(f"AWS_ACCESS_KEY_ID={new.key.access_key_id}")
        self.stdout.write(f"AWS_SECRET_ACCESS_KEY={new.secret}")
