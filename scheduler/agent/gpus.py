"""Which GPUs this machine has: NVML (nvidia-ml-py), or fake ones for development and tests."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from scheduler.limits import GPU_TYPE_PATTERN

NVML_MISSING = (
    "cannot discover GPUs: NVML is not available ({error}). On a GPU machine install the "
    "NVIDIA driver and nvidia-ml-py; without GPUs pass --fake-gpus N --gpu-type T."
)
NVML_UNREADABLE = (
    "NVML could not read {which} ({error}); check that this user may open /dev/nvidia*, or "
    "pass --fake-gpus N --gpu-type T."
)
MIXED_TYPES = "this node has GPUs of several types ({types}); a node must have one GPU type."
NO_GPUS = "NVML found no GPU on this machine; pass --fake-gpus N --gpu-type T to fake some."
# The portal's rule for a GPU type (shares.models.validate_gpu_type): shares' limits name GPU
# types so, and a node whose type breaks it would never get a job.
GPU_TYPE = re.compile(GPU_TYPE_PATTERN)
GPU_TYPE_RULE = "lowercase letters, digits and dashes, like h100 or a100-80g"

# A model name's words (lowercase, split on anything not a letter or digit) → GPU type. The
# first word found in this order wins, so "gh200" is tried before "h200" would match nothing.
MODEL_WORDS = [
    ("gb200", "gb200"),
    ("b200", "b200"),
    ("gh200", "gh200"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("h800", "h800"),
    ("a100", "a100"),  # completed with its memory below
    ("a800", "a800"),
    ("l40s", "l40s"),
    ("l40", "l40"),
    ("l4", "l4"),
    ("a10g", "a10g"),
    ("a10", "a10"),
    ("a30", "a30"),
    ("a40", "a40"),
    ("t4", "t4"),
    ("v100", "v100"),
    ("a6000", "rtx-a6000"),
]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mb: int
    fake: bool = field(default=False, compare=False)

    def as_json(self) -> dict:
        """What the agent tells the portal of the GPU at registration."""
        details = asdict(self)
        del details["fake"]
        return details

    @property
    def cuda_visible_id(self) -> str:
        """How CUDA_VISIBLE_DEVICES names this GPU: by its UUID, because NVML's index need not
        be CUDA's (CUDA's default order is fastest first, NVML's documents no relation to it);
        a fake GPU, which CUDA never sees, by its index."""
        return str(self.index) if self.fake else self.uuid


def gpu_type_for_model(model: str, memory_mb: int | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' → h100, 'NVIDIA A100-SXM4-80GB' → a100-80g, 'NVIDIA L4' → l4.
    An unknown model becomes its name as a GPU type ('Tesla P100-PCIE-16GB' → tesla-p100-...)."""
    words = re.split(r"[^a-z0-9]+", model.lower())
    for word, gpu_type in MODEL_WORDS:
        if word in words:
            if gpu_type == "a100":
                big = "80gb" in words or (memory_mb is not None and memory_mb > 50_000)
                return "a100-80g" if big else "a100-40g"
            return gpu_type
    slug = "-".join(w for w in words if w and w != "nvidia")
    return slug[:32].strip("-") or "unknown"


def fake_gpus(count: int, gpu_type: str) -> list[Gpu]:
    return [
        Gpu(
            index=i,
            uuid=f"GPU-fake-{gpu_type}-{i}",
            model=f"fake {gpu_type}",
            memory_mb=0,
            fake=True,
        )
        for i in range(count)
    ]


class DiscoveryError(Exception):
    pass


def nvml_gpus() -> tuple[list[Gpu], str]:
    """The machine's GPUs and their type, from NVML. Raises DiscoveryError with what to do."""
    try:
        import pynvml
    except ImportError as error:
        raise DiscoveryError(NVML_MISSING.format(error=error)) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise DiscoveryError(NVML_MISSING.format(error=error)) from None
    index = None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                    model=name.decode() if isinstance(name, bytes) else name,
                    memory_mb=int(memory),
                )
            )
    except pynvml.NVMLError as error:
        # e.g. a GPU this user may not open (NVML counts it, then refuses its handle)
        which = "the GPUs" if index is None else f"GPU {index}"
        raise DiscoveryError(NVML_UNREADABLE.format(which=which, error=error)) from None
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise DiscoveryError(NO_GPUS)
    types = sorted({gpu_type_for_model(g.model, g.memory_mb) for g in gpus})
    if len(types) > 1:
        raise DiscoveryError(MIXED_TYPES.format(types=", ".join(types)))
    return gpus, types[0]
