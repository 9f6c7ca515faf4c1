"""Which GPUs a job's process sees. NVML's index of a GPU need not be CUDA's, so on a node whose
GPUs NVML found, CUDA_VISIBLE_DEVICES names them by UUID; fake GPUs, which CUDA never sees, by
index. No GPU machine runs these tests: the GPUs below are as NVML would describe them, and
scripts/gpu_check.py runs the same on a real GPU."""

from __future__ import annotations

import sys
import time

from scheduler.agent.core import Agent
from scheduler.agent.gpus import Gpu, fake_gpus

NVML_GPUS = [
    Gpu(
        index=i,
        uuid=f"GPU-5c0ffee{i}-0000-4000-8000-00000000000{i}",
        model="NVIDIA H200",
        memory_mb=143_771,
    )
    for i in range(4)
]


def _agent(tmp_path, gpus) -> Agent:
    return Agent(
        portal="http://127.0.0.1:9",
        join_token="x",
        name="n",
        gpu_type="h200",
        gpus=gpus,
        work_dir=tmp_path,
        checkpoint_root=tmp_path / "checkpoints",
    )


def _seen_by_job(agent: Agent, indices: list[int]) -> str:
    order = {
        "attempt": 1,
        "job": 1,
        "number": 1,
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
        "command": 'echo "$CUDA_VISIBLE_DEVICES" > seen',
        "gpu_indices": indices,
        "timeout_seconds": None,
        "grace_seconds": 0,
    }
    agent.start(order)
    agent.processes[1].popen.wait(10)
    seen = agent.checkpoint_root / "job-1" / "seen"
    deadline = time.monotonic() + 10
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return seen.read_text().strip()


def test_a_job_on_nvml_gpus_sees_them_by_uuid_in_the_portals_order(tmp_path):
    """The job's own CUDA_VISIBLE_DEVICES in its env is overridden by what it was given."""
    agent = _agent(tmp_path, NVML_GPUS)
    assert _seen_by_job(agent, [3, 1]) == f"{NVML_GPUS[3].uuid},{NVML_GPUS[1].uuid}"


def test_a_job_on_fake_gpus_sees_their_indices(tmp_path):
    assert _seen_by_job(_agent(tmp_path, fake_gpus(4, "h100")), [2, 3]) == "2,3"


def test_gpus_the_node_does_not_have_never_start(tmp_path):
    """An order for a GPU index this agent did not register (a node re-registered with fewer
    GPUs) is reported never started, naming the GPUs, rather than run on other GPUs."""
    agent = _agent(tmp_path, NVML_GPUS)
    agent.start(
        {
            "attempt": 1,
            "job": 1,
            "number": 1,
            "env": {},
            "command": "true",
            "gpu_indices": [3, 4],
            "timeout_seconds": None,
            "grace_seconds": 0,
        }
    )
    (event,) = agent.outbox
    assert (event["type"], event["end"]) == ("exited", "never_started")
    assert "[3, 4]" in event["detail"] and "4 GPUs" in event["detail"]
    assert not agent.processes


def test_the_portal_is_told_each_gpus_index_uuid_model_and_memory(tmp_path):
    assert NVML_GPUS[0].as_json() == {
        "index": 0,
        "uuid": NVML_GPUS[0].uuid,
        "model": "NVIDIA H200",
        "memory_mb": 143_771,
    }
    assert "fake" not in fake_gpus(1, "h100")[0].as_json()


def test_a_gpu_nvml_cannot_read_stops_the_agent_with_what_to_do(monkeypatch, capsys):
    """NVML counts a GPU it then refuses to open (no permission): a clear error and exit code
    2, not a traceback. (NVML stands in here: no GPU machine runs the tests.)"""
    from scheduler.agent.__main__ import main

    class Refused(Exception):
        pass

    class FakeNvml:
        NVMLError = Refused

        @staticmethod
        def nvmlInit():
            pass

        @staticmethod
        def nvmlShutdown():
            pass

        @staticmethod
        def nvmlDeviceGetCount():
            return 2

        @staticmethod
        def nvmlDeviceGetHandleByIndex(index):
            raise Refused("Insufficient Permissions")

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml)
    assert main(["--join-token", "x", "--name", "n"]) == 2
    err = capsys.readouterr().err
    assert "NVML could not read GPU 0 (Insufficient Permissions)" in err
    assert "--fake-gpus" in err
