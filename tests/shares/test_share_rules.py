"""Every rule of a quota share is enforced twice: by clean()/the services with a message that
names the field and the rule, and by the database itself."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from shares import models as m
from shares.models import CapacityLimit, QuotaShare, ShareChange
from shares.services import share_create, share_update


def messages(error: ValidationError) -> dict[str, list[str]]:
    return error.message_dict


def create(team, **kwargs):
    kwargs.setdefault("capacity_limits", {"h100": 8})
    kwargs.setdefault("name", "s1")
    return share_create(team=team, source=ShareChange.Source.COMMAND, **kwargs)


@pytest.mark.django_db
class TestShareValidation:
    def test_borrow_limit_only_with_lend_and_borrow(self, vision_team):
        """A RESERVE or LEND share cannot have a borrow limit other than -1."""
        for strategy in (QuotaShare.Strategy.RESERVE, QuotaShare.Strategy.LEND):
            with pytest.raises(ValidationError) as caught:
                create(vision_team, strategy=strategy, borrow_limit=50)
            assert messages(caught.value)["borrow_limit"] == [
                m.BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW
            ]

    def test_borrow_limit_below_minus_one(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, borrow_limit=-5)
        assert messages(caught.value)["borrow_limit"] == [m.BORROW_LIMIT_RANGE]

    def test_lend_and_borrow_accepts_a_percent(self, vision_team):
        share = create(vision_team, borrow_limit=50)
        assert share.borrow_limit == 50

    def test_grace_seconds_range(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, grace_seconds=86401)
        assert m.GRACE_SECONDS_RANGE in messages(caught.value)["grace_seconds"]

    def test_grace_defaults_to_120(self, vision_team):
        assert create(vision_team).grace_seconds == 120

    def test_weight_positive(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, weight=0)
        assert messages(caught.value)["weight"] == [m.WEIGHT_POSITIVE]

    def test_one_to_five_gpu_types(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, capacity_limits={})
        assert messages(caught.value)["capacity_limits"] == [m.CAPACITY_LIMITS_COUNT]
        six = {f"t{i}": 1 for i in range(6)}
        with pytest.raises(ValidationError) as caught:
            create(vision_team, name="s2", capacity_limits=six)
        assert messages(caught.value)["capacity_limits"] == [m.CAPACITY_LIMITS_COUNT]

    def test_max_gpus_at_least_one(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, capacity_limits={"h100": 0})
        assert "max_gpus" in messages(caught.value)

    def test_lend_limit_not_above_the_limit(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, capacity_limits={"h100": 8}, lend_limit={"h100": 9})
        assert messages(caught.value)["lend_limit"] == [
            m.LEND_LIMIT_ABOVE_LIMIT.format(max_gpus=8, gpu_type="h100")
        ]

    def test_plain_lend_limit_applies_to_every_type(self, vision_team):
        share = create(vision_team, capacity_limits={"h100": 8, "l4": 4}, lend_limit=2)
        assert share.lend_limits == {"h100": 2, "l4": 2}

    def test_gpu_type_format(self, vision_team):
        with pytest.raises(ValidationError) as caught:
            create(vision_team, capacity_limits={"H100 SXM": 8})
        assert messages(caught.value)["gpu_type"] == [m.GPU_TYPE_FORMAT.format(value="H100 SXM")]

    def test_name_is_a_unique_slug(self, vision_team):
        create(vision_team, name="dup")
        with pytest.raises(ValidationError) as caught:
            create(vision_team, name="dup")
        assert "name" in messages(caught.value)
        with pytest.raises(ValidationError) as caught:
            create(vision_team, name="not a slug")
        assert "name" in messages(caught.value)

    def test_a_failed_create_leaves_nothing_behind(self, vision_team):
        with pytest.raises(ValidationError):
            create(vision_team, capacity_limits={"h100": 8}, lend_limit={"h100": 9})
        assert not QuotaShare.objects.filter(name="s1").exists()


@pytest.mark.django_db
class TestDatabaseConstraints:
    """The database refuses what clean() refuses, for writes that bypass validation."""

    def assert_refused(self, write) -> None:
        with pytest.raises(IntegrityError), transaction.atomic():
            write()

    def test_borrow_limit_on_lend_share(self, vision_team):
        share = create(vision_team, strategy=QuotaShare.Strategy.LEND)
        self.assert_refused(lambda: QuotaShare.objects.filter(pk=share.pk).update(borrow_limit=10))

    def test_borrow_limit_below_minus_one(self, vision_team):
        share = create(vision_team)
        self.assert_refused(lambda: QuotaShare.objects.filter(pk=share.pk).update(borrow_limit=-2))

    def test_grace_above_a_day(self, vision_team):
        share = create(vision_team)
        self.assert_refused(
            lambda: QuotaShare.objects.filter(pk=share.pk).update(grace_seconds=90000)
        )

    def test_weight_zero(self, vision_team):
        share = create(vision_team)
        self.assert_refused(lambda: QuotaShare.objects.filter(pk=share.pk).update(weight=0))

    def test_lend_limit_above_limit(self, vision_team):
        share = create(vision_team)
        self.assert_refused(lambda: CapacityLimit.objects.filter(share=share).update(lend_limit=9))

    def test_max_gpus_zero(self, vision_team):
        share = create(vision_team)
        self.assert_refused(lambda: CapacityLimit.objects.filter(share=share).update(max_gpus=0))

    def test_one_limit_per_type(self, vision_team):
        share = create(vision_team)
        self.assert_refused(
            lambda: CapacityLimit.objects.create(share=share, gpu_type="h100", max_gpus=1)
        )


@pytest.mark.django_db
class TestShareHistory:
    def test_creation_is_recorded(self, vision_team, root):
        share = create(vision_team, actor=root)
        fields = set(share.changes.values_list("field", flat=True))
        assert {"strategy", "capacity_limits", "grace_seconds", "state"} <= fields
        assert all(c.changed_by == root for c in share.changes.all())

    def test_each_changed_field_is_recorded_with_old_and_new(self, vision_team, root):
        """Who, when, which field, old → new: one row per changed field, none for the rest."""
        share = create(vision_team)
        share.changes.all().delete()
        share_update(
            share=share,
            actor=root,
            source=ShareChange.Source.API,
            grace_seconds=30,
            capacity_limits={"h100": 4, "l4": 2},
        )
        changes = {c.field: c for c in share.changes.all()}
        assert set(changes) == {"grace_seconds", "capacity_limits"}
        assert (changes["grace_seconds"].old_value, changes["grace_seconds"].new_value) == (
            "120",
            "30",
        )
        assert changes["capacity_limits"].old_value == "h100: 8"
        assert changes["capacity_limits"].new_value == "h100: 4, l4: 2"
        assert changes["grace_seconds"].changed_by == root
        assert changes["grace_seconds"].source == ShareChange.Source.API

    def test_a_rejected_update_records_nothing_and_changes_nothing(self, vision_team, root):
        share = create(vision_team, strategy=QuotaShare.Strategy.LEND)
        before = share.changes.count()
        with pytest.raises(ValidationError):
            share_update(share=share, actor=root, source="api", borrow_limit=20)
        share.refresh_from_db()
        assert share.borrow_limit == -1
        assert share.changes.count() == before

    def test_capacity_replacement_keeps_lend_limits_of_remaining_types(self, vision_team, root):
        share = create(vision_team, capacity_limits={"h100": 8, "l4": 4}, lend_limit={"h100": 3})
        share_update(share=share, actor=root, source="api", capacity_limits={"h100": 6})
        share.refresh_from_db()
        assert share.limits == {"h100": 6}
        assert share.lend_limits == {"h100": 3}
