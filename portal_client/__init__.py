"""Python client and CLI for the GPU quota sharing portal's REST API.

from portal_client import Client
portal = Client("http://127.0.0.1:8000", token)
job = portal.submit(share="research", gpus=8, gpu_type="h100", command="python train.py")
portal.wait(job["id"])

In a training script run by the portal, after each checkpoint: `checkpoint_saved()`.
"""

from portal_client.checkpoint import checkpoint_saved
from portal_client.client import FINAL_STATES, Client, JobEnded, PortalError, PortalUnreachable

__all__ = [
    "FINAL_STATES",
    "Client",
    "JobEnded",
    "PortalError",
    "PortalUnreachable",
    "checkpoint_saved",
]
