"""Each install brings what its code imports: every third-party module the server's packages
import comes from a distribution that `pip install 'gpu-quota-portal[server]'` installs (named in
the extra, or brought by one that is), the agent and the client import only what the bare
install brings, and the Kubernetes connector what its extra adds. Read from pyproject.toml and
the code, against the distributions installed here (the pinned requirements.txt): an import
whose distribution no install names fails here, not on an operator's server."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {
    "scheduler", "shares", "dashboards", "portal", "portal_client", "awsbatch", "notifications",
    "sso", "tests",
}  # fmt: skip
SERVER_PACKAGES = [
    "portal",
    "shares",
    "dashboards",
    "awsbatch",
    "notifications",
    "sso",
    "scheduler",
]
AGENT_PACKAGES = ["scheduler/agent", "portal_client"]
KUBERNETES_CONNECTOR = "scheduler/agent/kube.py"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def sources(packages: Iterable[str], leave_out: Iterable[str] = ()) -> list[Path]:
    """The package's modules, less tests and the paths left out."""
    left_out = [ROOT / path for path in leave_out]
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "tests" in path.relative_to(ROOT).parts:
                continue
            if any(path == out or out in path.parents for out in left_out):
                continue
            found.append(path)
    return found


def third_party_imports(paths: Iterable[Path]) -> dict[str, Path]:
    """Each third-party module imported (at any depth of the code), with a file importing it."""
    imported: dict[str, Path] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in sys.stdlib_module_names or top in FIRST_PARTY or top == "__future__":
                    continue
                imported.setdefault(top, path)
    return imported


def installed_closure(requirements: Iterable[str]) -> set[str]:
    """The distributions that installing `requirements` brings: them and, through the installed
    distributions' own requirements (with the extras asked of them), theirs."""
    brought: set[str] = set()
    todo: list[tuple[Requirement, set[str]]] = [(Requirement(line), set()) for line in requirements]
    while todo:
        requirement, for_extras = todo.pop()
        marker = requirement.marker
        if marker is not None and not any(
            marker.evaluate({"extra": extra}) for extra in (for_extras or {""})
        ):
            continue
        name = normalized(requirement.name)
        if name in brought:
            continue
        brought.add(name)
        own = importlib.metadata.requires(requirement.name) or []
        todo += [(Requirement(line), set(requirement.extras)) for line in own]
    return brought


def not_brought(imported: dict[str, Path], brought: set[str]) -> list[str]:
    """The imports whose distributions the install does not bring, with where they are."""
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module, path in sorted(imported.items()):
        providers = {normalized(name) for name in distributions.get(module, [])}
        if not providers & brought:
            missing.append(
                f"{module} (imported by {path.relative_to(ROOT)}; from {sorted(providers)})"
            )
    return missing


def project_requirements(*extras: str) -> list[str]:
    spec = project()
    lines = list(spec["dependencies"])
    for extra in extras:
        lines += spec["optional-dependencies"][extra]
    return lines


def test_the_server_extra_brings_everything_the_server_imports():
    imported = third_party_imports(sources(SERVER_PACKAGES, leave_out=["scheduler/agent"]))
    assert {"django", "celery", "uvicorn"} <= imported.keys()  # the walk finds imports
    assert not_brought(imported, installed_closure(project_requirements("server"))) == []


def test_the_bare_install_brings_everything_the_agent_and_the_client_import():
    imported = third_party_imports(sources(AGENT_PACKAGES, leave_out=[KUBERNETES_CONNECTOR]))
    assert "requests" in imported
    assert not_brought(imported, installed_closure(project_requirements())) == []


def test_the_kubernetes_extra_brings_everything_the_connector_imports():
    imported = third_party_imports([ROOT / KUBERNETES_CONNECTOR])
    assert "kubernetes" in imported
    brought = installed_closure(project_requirements("kubernetes"))
    assert not_brought(imported, brought) == []
