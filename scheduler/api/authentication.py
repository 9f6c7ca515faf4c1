"""Token authentication with the lookup written out: every API request pays for it."""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from portal.db.sql import instance_from_row, model_columns, prepared_cursor


@cache
def _user_by_token_sql() -> str:
    """The token's user in one statement, as DRF's Token.objects.select_related("user").get()
    reads it, without composing that ORM query at every request (bench/api.py)."""
    User = get_user_model()
    quote = connection.ops.quote_name
    return (
        f"SELECT {model_columns(User, 'u')} FROM {quote(User._meta.db_table)} u "
        f"INNER JOIN {quote(Token._meta.db_table)} t "
        f"ON t.{quote('user_id')} = u.{quote(User._meta.pk.column)} WHERE t.{quote('key')} = %s"
    )


class _AuthorizationHeader:
    """A request as DRF's TokenAuthentication.authenticate reads it (through
    get_authorization_header): `headers`, here only the Authorization header, taken from META.
    Django's request.headers maps every header of the request the first time it is read, for
    the one header this needs."""

    __slots__ = ("headers",)

    def __init__(self, request) -> None:
        authorization = request.META.get("HTTP_AUTHORIZATION")
        self.headers = {} if authorization is None else {"authorization": authorization}


class ApiTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`, answering exactly as DRF's TokenAuthentication does."""

    def authenticate(self, request):
        return super().authenticate(_AuthorizationHeader(request))

    def authenticate_credentials(self, key: str):
        with prepared_cursor() as cursor:
            cursor.execute(_user_by_token_sql(), [key])
            row = cursor.fetchone()
        if row is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        user = instance_from_row(get_user_model(), row)
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        # request.auth: the token with `created` deferred (read from the database if asked for).
        token = Token.from_db(None, ["key", "user_id"], [key, user.pk])
        token.user = user
        return (user, token)
