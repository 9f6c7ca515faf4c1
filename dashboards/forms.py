"""The what-if page's form: a job's shape as a submit gives it, checked by the submit's own
rules (`scheduler.jobs.services.job_estimate`)."""

from __future__ import annotations

from django import forms

from scheduler.models import MAX_PRIORITY


class EstimateForm(forms.Form):
    share = forms.ChoiceField(choices=())
    gpu_type = forms.ChoiceField(choices=(), label="GPU type")
    gpus = forms.IntegerField(min_value=1, label="GPUs")
    nodes = forms.IntegerField(min_value=1, initial=1)
    priority = forms.IntegerField(min_value=0, max_value=MAX_PRIORITY, initial=0)
    expected_seconds = forms.IntegerField(
        min_value=1, required=False, label="Expected run time (s)",
        help_text="What the estimate counts on for it; empty: the share's history.",
    )  # fmt: skip
    preemptible = forms.BooleanField(
        required=False, initial=True, help_text="Unticked: it runs only on its share's own GPUs."
    )

    def __init__(self, *args, shares=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["share"].choices = [(share.name, share.name) for share in shares]
        types = sorted(
            {limit.gpu_type for share in shares for limit in share.capacity_limits.all()}
        )
        self.fields["gpu_type"].choices = [(gpu_type, gpu_type) for gpu_type in types]
