"""A signed-in user's own API token (`Authorization: Token <key>`), made on the dashboards'
API token page: everyone needs one to submit over the REST API, and a user who signs in through
the OpenID provider has no shell to run `manage.py drf_create_token` on."""

from __future__ import annotations

import logging

from django.db import transaction
from rest_framework.authtoken.models import Token

logger = logging.getLogger(__name__)


def api_token_of(*, user) -> Token | None:
    """The user's token, if it has one (its key is not shown again)."""
    return Token.objects.filter(user=user).first()


def api_token_replace(*, user) -> Token:
    """A new API token for `user`, in place of the one it had: that one stops working at once.
    The key is the caller's to show, once."""
    with transaction.atomic():
        Token.objects.filter(user=user).delete()
        token = Token.objects.create(user=user)
    logger.info("API token of %s replaced", user.get_username())
    return token
