"""Readers of the environment variables behind the settings, for portal/settings.py and the apps'
conf.py modules alike, so every variable follows one rule: unset, it is its default; set, it
must be well formed. An empty or malformed value stops the portal at start with its name and
its rule (ImproperlyConfigured, which `gpu-portal-server` reports in one line), rather than
falling back to a default in silence or ending in a bare ValueError."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import environ
from django.core.exceptions import ImproperlyConfigured

SETTING_MALFORMED = "{name} must be {rule}, not {value!r}."
FLAG_RULE = "true or false (also yes/no, on/off, 1/0)"
FLAG_VALUES = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}

_env = environ.Env()


def _malformed(name: str, rule: str, value: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(SETTING_MALFORMED.format(name=name, rule=rule, value=value))


def flag(name: str, default: bool) -> bool:
    """A yes-or-no setting; unset, `default`."""
    if name not in os.environ:
        return default
    value = _env.str(name)
    if value.strip().lower() not in FLAG_VALUES:
        raise _malformed(name, FLAG_RULE, value)
    return FLAG_VALUES[value.strip().lower()]


def count(name: str, default: int, *, least: int = 1, most: int | None = None) -> int:
    """A whole number, at least `least` (and at most `most`, if given); unset, `default`."""
    if name not in os.environ:
        return default
    value = _env.str(name)
    number = value.strip()
    if not (
        number.isascii()
        and number.isdigit()
        and int(number) >= least
        and (most is None or int(number) <= most)
    ):
        rule = f"a whole number, {least} or more"
        if most is not None:
            rule = f"a whole number from {least} to {most}"
        raise _malformed(name, rule, value)
    return int(number)


def _amount(name: str, default: float, *, unit: str, zero: str) -> float:
    if name not in os.environ:
        return default
    value = _env.str(name)
    try:
        amount = float(value)
    except ValueError:
        amount = math.nan
    if not (math.isfinite(amount) and (amount > 0 or (zero and amount == 0))):
        rule = f"a number of {unit} above 0"
        if zero:
            rule = f"a number of {unit}, 0 or more (0: {zero})"
        raise _malformed(name, rule, value)
    return amount


def seconds(name: str, default: float, *, zero: str = "") -> float:
    """A duration in seconds: a finite number above 0, or also 0 where `zero` says what 0 means;
    unset, `default`."""
    return _amount(name, default, unit="seconds", zero=zero)


def days(name: str, default: float) -> float:
    """A duration in days (a retention): a finite number above 0; unset, `default`."""
    return _amount(name, default, unit="days", zero="")


def choice(name: str, default: str, choices: Sequence[str], *, any_case: bool = False) -> str:
    """One of `choices`, spelled as there (or in any case, with `any_case`: the choice's own
    spelling is returned); unset, `default`."""
    if name not in os.environ:
        return default
    value = _env.str(name)
    folded = value.strip().casefold() if any_case else value
    for option in choices:
        if folded == (option.casefold() if any_case else option):
            return option
    quoted = [repr(option) for option in choices]
    rule = (", ".join(quoted[:-1]) + " or " + quoted[-1]) if len(quoted) > 1 else quoted[0]
    raise _malformed(name, rule + (" (any case)" if any_case else ""), value)
