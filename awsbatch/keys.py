"""Access keys: created, looked up to verify a signature, revoked.

SigV4 is an HMAC keyed by the secret, so the portal must be able to recover the secret to
check a signature (a hash would not do). It is stored encrypted (Fernet: AES with an HMAC) with
a key derived from the portal's SECRET_KEY, which lives outside the database (the environment,
or the server's var directory): a leaked copy of the database alone lets no one sign. Changing
SECRET_KEY makes the keys unusable, unless the old one stays in SECRET_KEY_FALLBACKS."""

from __future__ import annotations

import base64
import secrets
import string
from dataclasses import dataclass
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from awsbatch.models import AccessKey
from portal.db.sql import instance_from_row, model_columns, select_rows

KEY_ID_PREFIX = "AKIA"  # as AWS's long-term keys: tools recognise the shape
KEY_ID_ALPHABET = string.ascii_uppercase + "234567"
SECRET_LENGTH = 40


def _fernet(secret_key: str) -> Fernet:
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"gpu-portal aws access keys"
    ).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _cipher() -> MultiFernet:
    return _cipher_for(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


@cache
def _cipher_for(secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([_fernet(key) for key in (secret_key, *fallbacks)])


@dataclass(frozen=True)
class NewKey:
    key: AccessKey
    secret: str  # shown once


# As many as a user may make for themselves, revoked ones not counted (AWS's IAM allows two);
# an admin may make more (the admin, `manage.py aws_access_key`).
MAX_OWN_ACTIVE_KEYS = 2
TOO_MANY_KEYS = (
    f"You have {MAX_OWN_ACTIVE_KEYS} active access keys: revoke one before making another."
)


class TooManyKeys(Exception):
    pass


def access_key_create_own(*, user, description: str = "") -> NewKey:
    """A new access key a user makes for themselves: TooManyKeys when they hold
    MAX_OWN_ACTIVE_KEYS active ones already. Their user row is locked while the keys are
    counted, so two requests at once cannot both pass the count."""
    with transaction.atomic():
        get_user_model().objects.select_for_update().only("pk").get(pk=user.pk)
        active = AccessKey.objects.filter(user=user, revoked_at__isnull=True).count()
        if active >= MAX_OWN_ACTIVE_KEYS:
            raise TooManyKeys(TOO_MANY_KEYS)
        return access_key_create(user=user, description=description)


def access_key_create(*, user, description: str = "") -> NewKey:
    """A new access key for `user`; its secret is returned once and stored only encrypted."""
    key_id = KEY_ID_PREFIX + "".join(secrets.choice(KEY_ID_ALPHABET) for _ in range(16))
    secret = secrets.token_urlsafe(SECRET_LENGTH)[:SECRET_LENGTH]
    key = AccessKey.objects.create(
        user=user,
        access_key_id=key_id,
        secret_encrypted=_cipher().encrypt(secret.encode()).decode(),
        description=description,
    )
    return NewKey(key=key, secret=secret)


def access_key_revoke(*, key: AccessKey) -> AccessKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def access_key_secret(key: AccessKey) -> str | None:
    """The key's secret, or None if this portal's SECRET_KEY cannot decrypt it."""
    try:
        return _cipher().decrypt(key.secret_encrypted.encode()).decode()
    except InvalidToken:
        return None


def active_key(access_key_id: str) -> AccessKey | None:
    """The key, not revoked, of a user still active, with its user: one written-out statement,
    prepared once per connection (every signed request looks its key up; the ORM's query
    costs several times more, bench/aws_api.py)."""
    rows = select_rows(_active_key_sql(), [access_key_id], _key_fields())
    if not rows:
        return None
    key = instance_from_row(AccessKey, rows[0])
    key.user = instance_from_row(get_user_model(), rows[0][len(AccessKey._meta.concrete_fields) :])
    return key


@cache
def _key_fields() -> tuple:
    return (*AccessKey._meta.concrete_fields, *get_user_model()._meta.concrete_fields)


@cache
def _active_key_sql() -> str:
    user = get_user_model()
    quote = connection.ops.quote_name
    return (
        f"SELECT {model_columns(AccessKey, 'k')}, {model_columns(user, 'u')} "
        f"FROM {quote(AccessKey._meta.db_table)} k "
        f"JOIN {quote(user._meta.db_table)} u ON u.{quote(user._meta.pk.column)} = k.user_id "
        "WHERE k.access_key_id = %s AND k.revoked_at IS NULL AND u.is_active"
    )


def access_key_used(*, key: AccessKey) -> None:
    """Note the key's use, at most once a minute (each signed request would otherwise write)."""
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() >= 60:
        AccessKey.objects.filter(pk=key.pk).update(last_used_at=now)
