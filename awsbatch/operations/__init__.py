"""The operations the portal answers, each a handler registered under AWS's operation name:
`handler(caller, params) -> dict` (the output shape's members). A handler maps the request onto
the portal's own services and selectors, as the native API's views do: no rule of DESIGN §2 is
implemented twice. It raises AwsError for what the caller must be told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HANDLERS: dict[str, Callable] = {}


@dataclass(frozen=True)
class Caller:
    """Who signed the request."""

    user: object
    region: str


def operation(name: str):
    def register(handler):
        HANDLERS[name] = handler
        return handler

    return register


def handler_for(name: str) -> Callable | None:
    # The modules register their handlers when imported.
    from awsbatch.operations import jobs, queue, shares  # noqa: F401

    return HANDLERS.get(name)
