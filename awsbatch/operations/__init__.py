"""The operations the portal answers, each a handler registered under AWS's operation name:
`handler(caller, params) -> dict` (the output shape's members). A handler maps the request onto
the portal's own services and selectors, as the native API's views do: no rule of DESIGN §2 is
implemented twice. It raises AwsError for what the caller must be told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HANDLERS: dict[str, Callable] = {}
# Handlers that run outside a transaction of the view's: reads, and SubmitServiceJob, whose job
# is inserted in one statement that commits on its own (scheduler.transitions.job_insert) as
# the native submit's is; a transaction around it would cost it round trips for nothing.
AUTOCOMMIT: set[str] = set()


@dataclass(frozen=True)
class Caller:
    """Who signed the request."""

    user: object
    region: str


def operation(name: str, *, atomic: bool = True):
    """Register `handler` for the operation `name`; `atomic`: the view runs it in a transaction
    (all its writes or none)."""

    def register(handler):
        HANDLERS[name] = handler
        if not atomic:
            AUTOCOMMIT.add(name)
        return handler

    return register


def handler_for(name: str) -> tuple[Callable | None, bool]:
    """The operation's handler, and whether it runs in a transaction."""
    # The modules register their handlers when imported.
    from awsbatch.operations import jobs, queue, shares  # noqa: F401

    return HANDLERS.get(name), name not in AUTOCOMMIT
