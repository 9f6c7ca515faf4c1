"""The churn breaker's settings keep their bounds on the cluster settings row itself, so the
admin and any other form or service that cleans the row refuse the same values with the same
words (docs/semantics.md, The churn breaker)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.forms import modelform_factory
from django.urls import reverse

from scheduler.models import CHURN_WINDOW_RANGE, MAX_CHURN_WINDOW_SECONDS, ClusterSettings

FIELDS = ["agent_join_token", "churn_preemptions", "churn_window_seconds"]


def settings_data(**overrides) -> dict:
    data = {"agent_join_token": "join-me", "churn_preemptions": "3", "churn_window_seconds": "3600"}
    data.update(overrides)
    return data


@pytest.mark.django_db
class TestChurnWindowBounds:
    @pytest.mark.parametrize("window", [0, MAX_CHURN_WINDOW_SECONDS + 1, 2**63 - 1])
    def test_the_row_refuses_a_window_out_of_its_bounds_naming_the_field(self, window):
        """Cleaning the row itself, not only the admin's form, refuses a window of no time or
        of more than 90 days (a held-off job's pages could show no date for its end)."""
        row = ClusterSettings.load()
        row.churn_window_seconds = window
        with pytest.raises(ValidationError) as refused:
            row.full_clean()
        assert refused.value.message_dict == {"churn_window_seconds": [CHURN_WINDOW_RANGE]}

    @pytest.mark.parametrize("window", [1, MAX_CHURN_WINDOW_SECONDS])
    def test_the_row_takes_a_window_within_its_bounds(self, window):
        row = ClusterSettings.load()
        row.churn_window_seconds = window
        row.full_clean()

    def test_any_form_of_the_row_refuses_a_window_beyond_90_days(self):
        """A form other than the admin's (as a settings page or a command would build) gets the
        rule from the model: the field and its bound, and nothing saved."""
        ClusterSettings.load()
        form_class = modelform_factory(ClusterSettings, fields=FIELDS)
        data = settings_data(churn_window_seconds=str(MAX_CHURN_WINDOW_SECONDS + 1))
        form = form_class(data, instance=ClusterSettings.load())
        assert form.errors == {"churn_window_seconds": [CHURN_WINDOW_RANGE]}
        assert ClusterSettings.load().churn_window_seconds == 3600

    def test_no_preemptions_turns_the_breaker_off_and_is_taken(self):
        """0 preemptions is a setting, not an error: the breaker holds no job off."""
        row = ClusterSettings.load()
        row.churn_preemptions = 0
        row.full_clean()

    def test_the_admin_says_the_window_s_bound_beside_the_field(self, client, root):
        """The admin's form is the model's: its error names the field and the bound, and its
        help text says the bound before the admin types."""
        client.force_login(root)
        ClusterSettings.load()
        url = reverse("admin:scheduler_clustersettings_change", args=[1])
        assert "1 to 7776000, 90 days" in client.get(url).content.decode()
        response = client.post(url, settings_data(churn_window_seconds="0"))
        assert response.status_code == 200
        assert response.context["adminform"].form.errors == {
            "churn_window_seconds": [CHURN_WINDOW_RANGE]
        }
        assert ClusterSettings.load().churn_window_seconds == 3600
