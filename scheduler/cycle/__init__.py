"""The scheduling cycle: one call of `run.cycle_run()` loads a snapshot, asks the engine for a
plan and applies it. `trigger.request_cycle()` is how services ask for one."""
