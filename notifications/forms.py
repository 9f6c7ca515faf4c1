"""The subscription page's form: the choices of the API, checked by the same service."""

from __future__ import annotations

from django import forms

from notifications.models import Kind, Subscription


class SubscriptionForm(forms.Form):
    scope = forms.ChoiceField(choices=Subscription.Scope.choices)
    share = forms.ChoiceField(choices=[("", "—")], required=False)
    kinds = forms.MultipleChoiceField(choices=Kind.choices, widget=forms.CheckboxSelectMultiple)
    channel = forms.ChoiceField(choices=Subscription.Channel.choices)
    target = forms.CharField(
        max_length=2000, required=False, help_text="E-mail (default: yours) or http(s) URL."
    )
    secret = forms.CharField(
        max_length=128, required=False, help_text="Webhook only; empty: the portal makes one."
    )

    def __init__(self, *args, shares=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["share"].choices = [("", "—"), *((s.name, s.name) for s in shares)]
