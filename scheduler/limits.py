"""Limits of the live portal, in a module without Django so that the simulator checks a
scenario against the same numbers as the models (`scheduler.models` imports them from here),
and the node agent a GPU type against the shares' rule."""

MAX_GPUS_PER_NODE = 64
# What a GPU type is (shares.models.validate_gpu_type; the agent's --gpu-type).
GPU_TYPE_PATTERN = r"[a-z0-9][a-z0-9-]{0,31}"
