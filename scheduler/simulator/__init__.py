"""Replay a scenario (shares, nodes, a job trace) through the engine on a simulated clock.

No Django, no database, no broker: `load_scenario` reads and checks a scenario, `simulate` runs it,
and `scheduler.simulator.cli.main` is the command line (`python -m scheduler.simulator`, and the
`manage.py simulate` command).
"""

from scheduler.simulator.clock import EngineContractError, SimulationResult, simulate
from scheduler.simulator.scenario import (
    JobSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

__all__ = [
    "EngineContractError",
    "JobSpec",
    "Scenario",
    "ScenarioError",
    "SimulationResult",
    "load_scenario",
    "parse_scenario",
    "simulate",
]
