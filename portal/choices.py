"""The REST API's refusal of a value that is none of a field's choices: it names the field and
what the field may be (DRF's own says only '"x" is not a valid choice.')."""

from __future__ import annotations

from django.db import models


def choice_errors(field: str, choices: type[models.TextChoices]) -> dict[str, str]:
    """`error_messages` for a ChoiceField or MultipleChoiceField of `choices`."""
    allowed = ", ".join(choices.values)
    return {"invalid_choice": f'{field}: "{{input}}" is none of {allowed}.'}
