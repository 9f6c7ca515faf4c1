"""The connector's view of a real cluster (scheduler.agent.kube.KubernetesCluster) against the
real API server: its watches, and what they make of pods and nodes."""

from __future__ import annotations

import json
import threading

import pytest
import requests

from scheduler.agent.kube import Informer, KubernetesCluster
from tests.kubernetes.conftest import JOB_IMAGE, OTHER_NAMESPACE, REAL_NODE
from tests.live import wait_for

pytestmark = pytest.mark.live


def sleeper(name: str, gpus: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": OTHER_NAMESPACE},
            "spec": {
                "nodeName": REAL_NODE,
                "hostNetwork": True,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": JOB_IMAGE,
                        "command": ["sleep", "3600"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        }
    )


def test_a_watch_that_cannot_resume_after_an_api_server_restart_lists_again(kube):
    """After an API server restart, a watch cannot resume from where it was: the new API
    server's watch cache holds nothing older than its own start (410 Gone). The watch gives
    way to a new list, which has every pod, among them one made while it was away, and then
    carries on: a pod made afterwards is seen."""
    cluster = KubernetesCluster(kubeconfig=kube.kubeconfig)
    seen: dict[str, dict] = {}

    def on_event(kind, obj):
        if kind == "LISTED":
            seen.clear()
            seen.update({p["metadata"]["name"]: p for p in obj})
        elif kind == "DELETED":
            seen.pop(obj["metadata"]["name"], None)
        else:
            seen[obj["metadata"]["name"]] = obj

    stopping = threading.Event()
    informer = Informer("pods", "/api/v1/pods", cluster._request, on_event, stopping)
    threading.Thread(target=informer.run, daemon=True).start()
    try:
        wait_for(informer.healthy.is_set, what="the watch")
        kube.kubectl("apply", "-f", "-", stdin=sleeper("before", 1))
        wait_for(lambda: "before" in seen, what="the pod, watched")
        kube.script("stop-apiserver")
        wait_for(lambda: not informer.healthy.is_set(), what="the watch lost")
        # Something else writes to etcd meanwhile (as the cluster's other clients do all the
        # time): the new API server starts past the watch's last resourceVersion.
        etcd = f"http://127.0.0.1:{int(kube.env['K8S_PORT_BASE']) + 1}/v3/kv/put"
        requests.post(etcd, json={"key": "L2dwdS1wb3J0YWwtdGVzdA==", "value": "eA=="}, timeout=10)
        kube.script("start-apiserver")
        wait_for(lambda: informer.relists == 2, what="a new list")
        kube.kubectl("apply", "-f", "-", stdin=sleeper("after", 1))
        wait_for(lambda: "after" in seen, what="the pod made after the list, watched")
        assert "before" in seen and informer.relists == 2 and informer.healthy.is_set()
    finally:
        stopping.set()


def test_gpus_of_pods_bound_to_a_node_are_counted_until_their_containers_have_ended(kube):
    """Every pod bound to a GPU node holds its GPUs from its admission until it has ended,
    whoever made it; kube1 is a READY node of 8 GPUs whose type comes from its label."""
    cluster = KubernetesCluster(kubeconfig=kube.kubeconfig)
    cluster.start()
    try:
        (node,) = cluster.nodes()
        assert (node.name, node.gpus, node.used_gpus, node.state) == (REAL_NODE, 8, 0, "READY")
        assert node.gpu_type == "h100-80gb-hbm3"
        kube.kubectl("apply", "-f", "-", stdin=sleeper("holder", 6))
        wait_for(lambda: cluster.nodes()[0].used_gpus == 6, what="6 GPUs held on kube1")
        kube.kubectl("delete", "pod", "holder", "-n", OTHER_NAMESPACE, "--wait=false")
        wait_for(lambda: cluster.nodes()[0].used_gpus == 0, what="kube1's GPUs free again")
    finally:
        cluster.stop()
