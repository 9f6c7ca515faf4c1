"""The cycle duration histogram's buckets moved from a JSON field to a column each
(dashboards 0002): the counts a portal had before the upgrade are kept, both ways."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("dashboards", "0001_initial")]
AFTER = [("dashboards", "0002_cycle_buckets_as_columns")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_upgrading_keeps_the_counts_of_every_bucket_and_downgrading_gives_them_back():
    try:
        apps = migrate(BEFORE)
        apps.get_model("dashboards", "CycleStats").objects.create(
            pk=1, buckets={"0.01": 361, "2.5": 4, "+Inf": 1}, runs_ok=365, runs_failed=1
        )

        apps = migrate(AFTER)
        stats = apps.get_model("dashboards", "CycleStats").objects.get(pk=1)
        assert (stats.le_0_01, stats.le_2_5, stats.le_inf, stats.le_0_005) == (361, 4, 1, 0)
        assert (stats.runs_ok, stats.runs_failed) == (365, 1)

        apps = migrate(BEFORE)
        stats = apps.get_model("dashboards", "CycleStats").objects.get(pk=1)
        assert stats.buckets == {"0.01": 361, "2.5": 4, "+Inf": 1}
    finally:
        migrate(AFTER)
