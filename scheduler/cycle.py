"""The scheduling cycle: load a snapshot, ask the engine for a plan, apply it."""


def cycle_run() -> None:
    """Placeholder until the cycle lands: nothing is scheduled yet."""
