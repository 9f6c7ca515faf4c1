"""Scenario files are checked strictly: every error names the entry and the rule."""

from __future__ import annotations

import pytest

from scheduler.simulator import ScenarioError, load_scenario, parse_scenario, simulate
from tests.simulator.helpers import h100_job, share, two_nodes


def error_of(data: dict) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    return str(caught.value)


def base(**extra) -> dict:
    return two_nodes(
        share("research", "LEND_AND_BORROW"),
        share("vision", "LEND"),
        jobs=[h100_job("j1", "research", 8, 0, 60)],
        **extra,
    )


def test_unknown_top_level_key_is_an_error():
    """A typo at the top level is refused, not ignored."""
    assert "unknown key nodez" in error_of(base(nodez=[]))


def test_unknown_share_key_names_the_share():
    """An unknown key in a share names that share."""
    data = base()
    data["shares"][1]["lend_limt"] = 4
    message = error_of(data)
    assert "shares[1] (vision)" in message and "lend_limt" in message


def test_share_needs_name_capacity_limits_and_strategy():
    """A share without a strategy is refused, naming the missing key."""
    data = base()
    del data["shares"][0]["strategy"]
    assert "shares[0] (research): `strategy` is required" in error_of(data)


def test_unknown_share_in_a_job_names_the_job():
    """A job for a share that does not exist names the job."""
    data = base()
    data["jobs"].append(h100_job("j2", "nlp", 8, 0, 60))
    message = error_of(data)
    assert "jobs[1] (j2)" in message and "unknown share 'nlp'" in message


def test_unknown_share_in_a_change_names_the_change():
    """A change for a share that does not exist names the change."""
    message = error_of(base(changes=[{"at": 5, "share": "nlp", "set": {"weight": 2}}]))
    assert "changes[0]" in message and "unknown share 'nlp'" in message


@pytest.mark.parametrize("strategy", ["RESERVE", "LEND"])
def test_borrow_limit_only_with_lend_and_borrow(strategy):
    """borrow_limit other than -1 on a RESERVE or LEND share is an error."""
    data = base()
    data["shares"][1].update(strategy=strategy, borrow_limit=50)
    message = error_of(data)
    assert "shares[1] (vision)" in message and "borrow_limit" in message


def test_lend_limit_above_the_limit_is_an_error():
    """A share cannot lend more GPUs than its limit."""
    data = base()
    data["shares"][1]["lend_limit"] = {"h100": 9}
    assert "lend_limit 9 h100 is above the limit 8" in error_of(data)


@pytest.mark.parametrize(
    "limits", [{}, {"h100": 0}, {f"t{i}": 1 for i in range(6)}], ids=["none", "zero", "six"]
)
def test_capacity_limits_need_one_to_five_types_of_at_least_one_gpu(limits):
    """capacity_limits with no type, a 0, or more than 5 types is refused."""
    data = base()
    data["shares"][0]["capacity_limits"] = limits
    assert "shares[0] (research): capacity_limits" in error_of(data)


def test_change_that_breaks_a_rule_names_the_change():
    """Switching a share with a borrow_limit to RESERVE is an error at that change."""
    data = base(changes=[{"at": 100, "share": "research", "set": {"strategy": "RESERVE"}}])
    data["shares"][0]["borrow_limit"] = 50
    message = error_of(data)
    assert "changes[0] (research)" in message and "borrow_limit" in message


def test_unknown_key_in_change_set_is_an_error():
    """A change may set only share fields."""
    message = error_of(base(changes=[{"at": 1, "share": "vision", "set": {"colour": "red"}}]))
    assert "changes[0] set" in message and "colour" in message


def test_unknown_job_key_and_duplicate_ids_are_errors():
    """Unknown job keys and an id used twice are refused."""
    data = base()
    data["jobs"][0]["gpu"] = 8
    assert "jobs[0] (j1)" in error_of(data)
    data = base()
    data["jobs"].append(h100_job("j1", "vision", 8, 0, 60))
    assert "j1: the id is used twice" in error_of(data)


def test_csv_trace_is_relative_to_the_scenario_and_adds_to_jobs(tmp_path):
    """A relative trace path is read next to the scenario file, and its jobs join `jobs`."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "jobs.csv").write_text(
        "id,share,gpu_type,gpus,submit,duration,priority,nodes,checkpoint_interval\n"
        "c1,vision,h100,8,0,100,5,,\n"
        "c2,research,h100,16,10,50,0,2,30\n"
    )
    (tmp_path / "scenario.yaml").write_text(
        "nodes: [{name: gpu, gpu_type: h100, gpus: 8, count: 2}]\n"
        "shares:\n"
        "  - {name: research, capacity_limits: {h100: 8}, strategy: LEND_AND_BORROW}\n"
        "  - {name: vision, capacity_limits: {h100: 8}, strategy: LEND}\n"
        "trace: sub/jobs.csv\n"
        "jobs: [{id: y1, share: research, gpu_type: h100, gpus: 8, submit: 500, duration: 5}]\n"
    )
    scenario = load_scenario(tmp_path / "scenario.yaml")
    jobs = {job.id: job for job in scenario.jobs}
    assert set(jobs) == {"y1", "c1", "c2"}
    assert (jobs["c1"].priority, jobs["c1"].nodes, jobs["c1"].checkpoint_interval) == (5, 1, None)
    assert (jobs["c2"].nodes, jobs["c2"].checkpoint_interval) == (2, 30)
    result = simulate(scenario).data
    assert {job["id"]: job["state"] for job in result["jobs"]} == dict.fromkeys(jobs, "SUCCEEDED")


def test_csv_row_errors_name_the_line_and_job(tmp_path):
    """A bad CSV row is reported with its file, line and job id."""
    (tmp_path / "t.csv").write_text(
        "id,share,gpu_type,gpus,submit,duration,priority\nok,vision,h100,8,0,10,0\n"
        "bad,nobody,h100,8,0,10,0\n"
    )
    data = base(trace="t.csv")
    with pytest.raises(ScenarioError, match=r"trace t\.csv line 3 \(bad\): unknown share"):
        parse_scenario(data, base_dir=tmp_path)


def test_csv_with_an_unknown_column_is_an_error(tmp_path):
    """Columns beyond the documented ones are refused."""
    (tmp_path / "t.csv").write_text("id,share,gpu_type,gpus,submit,duration,priority,user\n")
    with pytest.raises(ScenarioError, match="unknown columns user"):
        parse_scenario(base(trace="t.csv"), base_dir=tmp_path)


def test_missing_scenario_file_is_a_scenario_error(tmp_path):
    """A path that does not exist gives a ScenarioError, not a traceback."""
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")
