"""`gpu-agent` (or `python -m scheduler.agent`): run the node agent (docs/agent.md), or with
`gpu-agent slurm ...` the connector of a Slurm cluster (docs/slurm.md), with
`gpu-agent kubernetes ...` that of a Kubernetes cluster (docs/kubernetes.md)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import socket
import sys
from pathlib import Path

from scheduler.agent.core import KEEP_LOGS_DAYS, Agent
from scheduler.agent.gpus import GPU_TYPE, GPU_TYPE_RULE, DiscoveryError, fake_gpus, nvml_gpus
from scheduler.agent.transport import checked_portal_url
from scheduler.version import VERSION

# Where the Kubernetes connector's jobs find their checkpoints, on every node.
DEFAULT_CHECKPOINT_ROOT = "/var/lib/gpu-portal/checkpoints"
JOIN_TOKEN_REQUIRED = (
    "error: --join-token (or AGENT_JOIN_TOKEN) is required; the admin shows it under Cluster "
    "settings."
)


def _portal_arguments(parser: argparse.ArgumentParser) -> None:
    """What the agent and the connectors share: the portal, how to join it, the long poll."""
    env = os.environ.get
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    parser.add_argument(
        "--portal",
        type=_portal_url,
        default=env("PORTAL_URL", "http://127.0.0.1:8000"),
        help="portal base URL, http(s)://host[:port][/path] (PORTAL_URL)",
    )
    parser.add_argument(
        "--join-token",
        default=env("AGENT_JOIN_TOKEN", ""),
        help="the cluster's join token, from the admin (AGENT_JOIN_TOKEN)",
    )
    parser.add_argument(
        "--poll-wait",
        type=_seconds,
        # argparse passes a string default through `type` too: a bad environment variable is
        # refused like the flag's value, naming the flag.
        default=env("AGENT_POLL_WAIT", "10"),
        help="seconds a long poll may wait for orders (AGENT_POLL_WAIT)",
    )
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default=env("AGENT_LOG_LEVEL", "INFO"),
        help=f"{', '.join(LOG_LEVELS)}, in any case (AGENT_LOG_LEVEL)",
    )
    parser.add_argument(
        "--keep-logs-days",
        type=_days,
        default=env("AGENT_KEEP_LOGS_DAYS", str(KEEP_LOGS_DAYS)),
        help="job logs in WORK_DIR/logs are removed this many days after they were last "
        f"written; 0 keeps them (AGENT_KEEP_LOGS_DAYS; default {KEEP_LOGS_DAYS:g})",
    )


def _portal_url(value: str) -> str:
    try:
        return checked_portal_url(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(value: str) -> float:
    """A number of seconds > 0: a poll that waits for nothing would be sent again at once."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"not a number of seconds > 0: {value!r}")
    return seconds


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: str) -> str:
    """A level of Python's logging, in any case (`debug`: DEBUG)."""
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"not a log level: {value!r}; use one of {', '.join(LOG_LEVELS)}"
        )
    return value.upper()


def _gpu_count(value: str) -> int:
    """--fake-gpus: 1 or more (leaving it out is how to ask NVML)."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"not a number of GPUs ≥ 1: {value!r} (to ask NVML, leave out --fake-gpus and "
            "AGENT_FAKE_GPUS)"
        )
    return count


def _gpu_type(value: str) -> str:
    """A GPU type as the portal's shares name them (a node of another would get no job)."""
    if not GPU_TYPE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a GPU type: {value!r}; use {GPU_TYPE_RULE}")
    return value


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = -1.0
    if not days >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"not a number of days ≥ 0: {value!r}")
    return days


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="gpu-agent", description="Run jobs of the GPU portal on this node."
    )
    _portal_arguments(parser)
    parser.add_argument(
        "--name",
        default=env("AGENT_NAME", socket.gethostname()),
        help="node name (AGENT_NAME; default: host name)",
    )
    parser.add_argument(
        "--fake-gpus",
        type=_gpu_count,
        # AGENT_FAKE_GPUS=0 or empty, as unset: NVML.
        default=None if env("AGENT_FAKE_GPUS", "").strip() in ("", "0") else env("AGENT_FAKE_GPUS"),
        help="pretend to have N ≥ 1 GPUs instead of asking NVML (AGENT_FAKE_GPUS; 0: NVML)",
    )
    parser.add_argument(
        "--gpu-type",
        type=_gpu_type,
        default=env("AGENT_GPU_TYPE") or None,
        help=f"GPU type of the fake GPUs, or to override NVML's: {GPU_TYPE_RULE} (AGENT_GPU_TYPE)",
    )
    parser.add_argument(
        "--work-dir",
        default=env("AGENT_WORK_DIR", ""),
        help="logs and state (AGENT_WORK_DIR; default ~/.gpu-agent/NAME)",
    )
    parser.add_argument(
        "--checkpoint-root",
        default=env("AGENT_CHECKPOINT_ROOT", ""),
        help="CHECKPOINT_DIR of job J is ROOT/job-J; share it between nodes so a "
        "job resumes anywhere (AGENT_CHECKPOINT_ROOT; default WORK_DIR/checkpoints)",
    )
    return parser.parse_args(argv)  # fmt: skip


def parse_slurm(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="gpu-agent slurm",
        description="Bring the GPU nodes of a Slurm cluster to the portal: the portal decides "
        "who runs where, Slurm runs the jobs. One per cluster, on a host where sbatch works.",
    )
    _portal_arguments(parser)
    parser.add_argument(
        "--partition", action="append", default=[],
        help="a partition whose GPU nodes the portal shares (repeat, or comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-type", action="append", default=[], metavar="TYPE or NODE=TYPE",
        help="GPU type of the nodes whose GRES gpu has no type; NODE=TYPE for some nodes only "
        "(NODE may be a glob such as 'gpu-a*'); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--name", default=env("CONNECTOR_NAME", ""),
        help="the cluster's name in the portal (CONNECTOR_NAME; default: Slurm's ClusterName)",
    )  # fmt: skip
    parser.add_argument("--work-dir", default=env("AGENT_WORK_DIR", ""),
                        help="batch scripts and job logs (default ~/.gpu-agent/slurm-NAME); on a "
                        "file system the Slurm nodes share, for the logs")  # fmt: skip
    parser.add_argument(
        "--checkpoint-root", default=env("AGENT_CHECKPOINT_ROOT", ""),
        help="CHECKPOINT_DIR of job J is ROOT/job-J, on a file system the nodes share "
        "(default WORK_DIR/checkpoints)",
    )  # fmt: skip
    parser.add_argument("--job-prefix", default="portal",
                        help="Slurm job names start with it (default: portal)")  # fmt: skip
    parser.add_argument(
        "--sbatch-arg", action="append", default=[],
        help="an extra sbatch option for every job, e.g. --sbatch-arg=--account=gpu-portal",
    )  # fmt: skip
    parser.add_argument(
        "--pending-timeout", type=_seconds, default=env("CONNECTOR_PENDING_TIMEOUT", "60"),
        help="seconds a job may stay pending in Slurm before it is withdrawn and requeued",
    )  # fmt: skip
    return parser.parse_args(argv)


def parse_kubernetes(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="gpu-agent kubernetes",
        description="Bring the GPU nodes of a Kubernetes cluster to the portal: the portal "
        "decides who runs where, the kubelets run the jobs as pods. One per cluster, with "
        "kubeconfig or in-cluster credentials (docs/kubernetes.md).",
    )
    _portal_arguments(parser)
    parser.add_argument(
        "--name", default=env("CONNECTOR_NAME", ""),
        help="the cluster's name in the portal (CONNECTOR_NAME; default: the kubeconfig "
        "context's cluster, else 'kubernetes')",
    )  # fmt: skip
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG") or None,
                        help="kubeconfig file (KUBECONFIG; default ~/.kube/config, or the "
                        "in-cluster service account)")  # fmt: skip
    parser.add_argument("--context", default=None, help="the kubeconfig context to use")
    parser.add_argument("--namespace", default=env("CONNECTOR_NAMESPACE", "gpu-portal"),
                        help="where the connector's pods run (default: gpu-portal)")  # fmt: skip
    parser.add_argument(
        "--image", default=env("CONNECTOR_IMAGE", ""),
        help="the container image of jobs that name none (CONNECTOR_IMAGE)",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-type", action="append", default=[], metavar="TYPE or NODE=TYPE",
        help="GPU type of the nodes without the GPU product label; NODE=TYPE for some nodes "
        "only (NODE may be a glob such as 'gpu-a*'); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-product", action="append", default=[], metavar="PRODUCT=TYPE",
        help="the portal's GPU type for a value of the GPU product label, e.g. "
        "NVIDIA-H100-80GB-HBM3=h100 (default: the label's value, lowercase, without "
        "'NVIDIA-'); repeatable",
    )  # fmt: skip
    parser.add_argument("--gpu-label", default="nvidia.com/gpu.product",
                        help="the node label with the GPU product (default: the one NVIDIA's "
                        "GPU feature discovery sets, nvidia.com/gpu.product)")  # fmt: skip
    parser.add_argument(
        "--node-selector",
        default="",
        help="a label selector: only the GPU nodes it picks are shared",
    )
    parser.add_argument(
        "--checkpoint-root", default=env("AGENT_CHECKPOINT_ROOT", DEFAULT_CHECKPOINT_ROOT),
        help="CHECKPOINT_DIR of job J is ROOT/job-J: a file system mounted at ROOT on every node "
        f"and on the connector's host (a hostPath volume; default {DEFAULT_CHECKPOINT_ROOT})",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint-claim", default="",
        help="mount this ReadWriteMany PersistentVolumeClaim at the checkpoint root instead of "
        "a hostPath",
    )  # fmt: skip
    parser.add_argument("--host-network", action="store_true",
                        help="run the pods in their nodes' network namespace")  # fmt: skip
    parser.add_argument(
        "--pod-template", default="",
        help="a YAML or JSON pod whose settings every job's pod takes (tolerations, a runtime "
        "class, image pull secrets, a security context, volumes; its first container's env, "
        "mounts and resources); never its node, command, image or GPUs",
    )  # fmt: skip
    parser.add_argument(
        "--work-dir",
        default=env("AGENT_WORK_DIR", ""),
        help="the connector's own files (default ~/.gpu-agent/kubernetes-NAME)",
    )
    parser.add_argument("--job-prefix", default="portal",
                        help="pod names start with it (default: portal)")  # fmt: skip
    parser.add_argument(
        "--pending-timeout", type=_seconds, default=env("CONNECTOR_PENDING_TIMEOUT", "60"),
        help="seconds a pod may stay pending before its attempt is withdrawn and requeued",
    )  # fmt: skip
    return parser.parse_args(argv)


def _gpu_types(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """--gpu-type's values: the default type, and NODE=TYPE by node (or glob)."""
    default_type, node_types = None, {}
    for value in values:
        node, sep, gpu_type = value.rpartition("=")
        if sep:
            node_types[node] = gpu_type
        else:
            default_type = gpu_type
    return default_type, node_types


def _cannot_use(error: OSError) -> int:
    """A directory the agent or connector cannot make or write: one line, exit 2."""
    print(f"error: cannot use {error.filename}: {error.strerror} (see --work-dir and "
          "--checkpoint-root)", file=sys.stderr)  # fmt: skip
    return 2


def _run_until_signalled(worker) -> int:
    """Run the agent or connector until SIGTERM or SIGINT, which it answers by stopping."""

    def stop(*_args) -> None:
        worker.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()
    return 0


def main_slurm(argv: list[str]) -> int:
    from scheduler.agent.connector import Connector
    from scheduler.agent.slurm import (
        SlurmCluster,
        SlurmRefused,
        SlurmUnreachable,
        slurm_environment,
    )

    args = parse_slurm(argv)
    partitions = tuple(p for value in args.partition for p in value.split(",") if p)
    if not args.join_token:
        print(JOIN_TOKEN_REQUIRED, file=sys.stderr)
        return 2
    if not partitions:
        print("error: --partition is required: the Slurm partition(s) whose GPU nodes the "
              "portal shares.", file=sys.stderr)  # fmt: skip
        return 2
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf and not Path(slurm_conf).is_file():
        # Slurm's own commands would retry reading it for a minute before saying so.
        print(f"error: SLURM_CONF={slurm_conf}: no such file; it names the cluster's "
              "slurm.conf (unset it, and Slurm's commands find theirs as for any user).",
              file=sys.stderr)  # fmt: skip
        return 2
    default_type, node_types = _gpu_types(args.gpu_type)
    cluster = SlurmCluster(
        partitions=partitions, prefix=args.job_prefix, default_gpu_type=default_type,
        node_gpu_types=node_types, sbatch_args=tuple(args.sbatch_arg),
        env=slurm_environment(slurm_conf),
    )  # fmt: skip
    name = args.name
    if not name:
        try:
            name = cluster.config().get("ClusterName", "")
        except (SlurmUnreachable, SlurmRefused) as error:
            print(f"error: cannot ask Slurm for the cluster's name ({error}); check that this "
                  "host's Slurm commands reach slurmctld, or give the name with --name.",
                  file=sys.stderr)  # fmt: skip
            return 2
    # Slurm unreachable (a name given): the connector starts, and retries Slurm.
    with contextlib.suppress(SlurmUnreachable, SlurmRefused):
        if unknown := cluster.unknown_partitions():
            print(f"error: --partition: Slurm has no partition {', '.join(unknown)} (sinfo "
                  "--all lists those it has).", file=sys.stderr)  # fmt: skip
            return 2
    if not name:
        print("error: Slurm does not answer `scontrol show config` with a ClusterName; "
              "give the cluster's name with --name.", file=sys.stderr)  # fmt: skip
        return 2
    log_format = f"%(asctime)s %(levelname)s connector[{name}]: %(message)s"
    logging.basicConfig(level=args.log_level, format=log_format)
    work_dir = Path(args.work_dir or Path.home() / ".gpu-agent" / f"slurm-{name}")
    cluster.script_dir = work_dir / "scripts"
    checkpoint_root = Path(args.checkpoint_root or work_dir / "checkpoints")
    try:
        connector = Connector(
            portal=args.portal, join_token=args.join_token, name=name, cluster=cluster,
            work_dir=work_dir, checkpoint_root=checkpoint_root,
            poll_wait=args.poll_wait, pending_timeout=args.pending_timeout,
            keep_logs_days=args.keep_logs_days,
        )  # fmt: skip
    except OSError as error:
        return _cannot_use(error)
    return _run_until_signalled(connector)


def main_kubernetes(argv: list[str]) -> int:
    args = parse_kubernetes(argv)
    if not args.join_token:
        print(JOIN_TOKEN_REQUIRED, file=sys.stderr)
        return 2
    try:
        from scheduler.agent.cluster import ClusterRefused
        from scheduler.agent.connector import Connector
        from scheduler.agent.kube import (
            KubernetesCluster,
            kubeconfig_cluster_name,
            read_pod_template,
        )
    except ImportError as error:
        print(f"error: the Kubernetes connector needs the kubernetes client ({error}): pip "
              "install 'gpu-quota-portal[kubernetes]'", file=sys.stderr)  # fmt: skip
        return 2
    products = {}
    for value in args.gpu_product:
        product, sep, gpu_type = value.rpartition("=")
        if not sep:
            print(f"error: --gpu-product takes PRODUCT=TYPE, not {value!r}.", file=sys.stderr)
            return 2
        products[product] = gpu_type
    template = None
    if args.pod_template:
        try:
            template = read_pod_template(args.pod_template)
        except ValueError as error:
            print(f"error: --pod-template: {error}", file=sys.stderr)
            return 2
    name = args.name or kubeconfig_cluster_name(args.kubeconfig, args.context) or "kubernetes"
    default_type, node_types = _gpu_types(args.gpu_type)
    cluster = KubernetesCluster(
        namespace=args.namespace, connector=name, prefix=args.job_prefix, image=args.image,
        gpu_label=args.gpu_label, default_gpu_type=default_type, node_gpu_types=node_types,
        product_types=products, node_selector=args.node_selector,
        checkpoint_root=Path(args.checkpoint_root), checkpoint_claim=args.checkpoint_claim or None,
        host_network=args.host_network, pod_template=template, kubeconfig=args.kubeconfig,
        context=args.context,
    )  # fmt: skip
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        print(f"error: --kubeconfig {args.kubeconfig}: no such file", file=sys.stderr)
        return 2
    try:
        cluster.load_credentials()
    except ClusterRefused as error:
        print(f"error: {error} (give --kubeconfig, or run the connector in a pod with a "
              "service account)", file=sys.stderr)  # fmt: skip
        return 2
    logging.basicConfig(
        level=args.log_level, format=f"%(asctime)s %(levelname)s connector[{name}]: %(message)s"
    )
    work_dir = Path(args.work_dir or Path.home() / ".gpu-agent" / f"kubernetes-{name}")
    try:
        connector = Connector(
            portal=args.portal, join_token=args.join_token, name=name, cluster=cluster,
            work_dir=work_dir, checkpoint_root=Path(args.checkpoint_root),
            poll_wait=args.poll_wait, pending_timeout=args.pending_timeout,
            keep_logs_days=args.keep_logs_days,
        )  # fmt: skip
    except OSError as error:
        return _cannot_use(error)
    return _run_until_signalled(connector)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["slurm"]:
        return main_slurm(argv[1:])
    if argv[:1] == ["kubernetes"]:
        return main_kubernetes(argv[1:])
    args = parse(argv)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s agent[{args.name}]: %(message)s",
    )
    if not args.join_token:
        print(JOIN_TOKEN_REQUIRED, file=sys.stderr)
        return 2
    if args.fake_gpus:
        if not args.gpu_type:
            print("error: --fake-gpus needs --gpu-type (e.g. h100).", file=sys.stderr)
            return 2
        gpus, gpu_type = fake_gpus(args.fake_gpus, args.gpu_type), args.gpu_type
    else:
        try:
            gpus, gpu_type = nvml_gpus()
        except DiscoveryError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        gpu_type = args.gpu_type or gpu_type
    work_dir = Path(args.work_dir or Path.home() / ".gpu-agent" / args.name)
    try:
        agent = Agent(
            portal=args.portal,
            join_token=args.join_token,
            name=args.name,
            gpu_type=gpu_type,
            gpus=gpus,
            work_dir=work_dir,
            checkpoint_root=Path(args.checkpoint_root or work_dir / "checkpoints"),
            poll_wait=args.poll_wait,
            keep_logs_days=args.keep_logs_days,
        )
    except OSError as error:
        return _cannot_use(error)
    return _run_until_signalled(agent)


if __name__ == "__main__":
    sys.exit(main())
