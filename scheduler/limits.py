"""Limits of the live portal, in a module without Django so that the simulator checks a
scenario against the same numbers as the models (`scheduler.models` imports them from here)."""

MAX_GPUS_PER_NODE = 64
