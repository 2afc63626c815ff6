"""The deploy files agree with each other and with the CLI: kustomize renders, ports and probes
line up, the proxy's configuration loads, and every SGLang command line is the launcher's plan."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from servers import free_port, run_server

from specroute.cli import build_parser
from specroute.config import Config, load_config
from specroute.launch.plan import LaunchOptions, sglang_server_args

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
MODEL = "/models/model"
SGLANG_PORT = 30000


def _expected_args(steps: int) -> list[str]:
    """What `specroute launch --model /models/model --host 0.0.0.0` plans for this depth."""
    options = LaunchOptions(model=MODEL, steps=(1, 2, 3), host="0.0.0.0")
    return sglang_server_args(options, steps, SGLANG_PORT)


def _render_by_hand(directory: Path) -> list[dict[str, Any]]:
    """The part of kustomize these manifests use: resources and common labels."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    labels: dict[str, str] = {}
    for entry in kustomization.get("labels", []):
        labels.update(entry["pairs"])
    docs = []
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((directory / resource).read_text()):
            doc["metadata"].setdefault("labels", {}).update(labels)
            docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        out = subprocess.run(
            [kubectl, "kustomize", str(KUSTOMIZE)], capture_output=True, text=True, check=True
        ).stdout
        docs = list(yaml.safe_load_all(out))
        assert len(docs) == len(_render_by_hand(KUSTOMIZE))
    else:
        docs = _render_by_hand(KUSTOMIZE)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _port(container: dict[str, Any], name: str) -> int:
    return next(int(p["containerPort"]) for p in container["ports"] if p["name"] == name)


def _proxy_config(rendered: dict[tuple[str, str], dict[str, Any]], tmp: Path) -> Any:
    path = tmp / "specroute.toml"
    path.write_text(rendered[("ConfigMap", "specroute-config")]["data"]["specroute.toml"])
    return load_config(path, environ={})


def test_kustomization_renders_every_part(rendered: dict[tuple[str, str], Any]) -> None:
    assert set(rendered) == {
        ("ConfigMap", "specroute-config"),
        ("Deployment", "specroute"),
        ("Service", "specroute"),
        ("HorizontalPodAutoscaler", "specroute"),
        ("Service", "sglang"),
        ("Deployment", "sglang-steps1"),
        ("Deployment", "sglang-steps2"),
        ("Deployment", "sglang-steps3"),
    }
    for doc in rendered.values():
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"


def test_proxy_config_ports_and_probes_agree(rendered: dict[Any, Any], tmp_path: Path) -> None:
    config = _proxy_config(rendered, tmp_path)
    deployment = rendered[("Deployment", "specroute")]
    proxy = _container(deployment)
    assert config.host == "0.0.0.0"
    assert config.port == _port(proxy, "http")
    assert config.policy == Config().policy  # the product's default, not a baseline
    assert proxy["args"] == ["serve", "--config", "/etc/specroute/specroute.toml"]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert proxy["resources"]["requests"]
    assert proxy["resources"]["limits"]
    service = rendered[("Service", "specroute")]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    hpa = rendered[("HorizontalPodAutoscaler", "specroute")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "specroute"
    assert hpa["minReplicas"] >= 2
    # The image runs as the Dockerfile's user.
    uid = deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"--uid {uid}" in (ROOT / "Dockerfile").read_text()


def test_proxy_discovers_the_headless_sglang_service(
    rendered: dict[Any, Any], tmp_path: Path
) -> None:
    (backend,) = _proxy_config(rendered, tmp_path).backends
    assert backend.resolve_every_s is not None
    assert backend.url == f"http://sglang:{SGLANG_PORT}"
    service = rendered[("Service", "sglang")]["spec"]
    assert service["clusterIP"] == "None"
    assert service["ports"][0]["port"] == SGLANG_PORT
    for k in (1, 2, 3):
        pod = rendered[("Deployment", f"sglang-steps{k}")]["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert all(labels[key] == value for key, value in service["selector"].items())
        assert _port(pod["spec"]["containers"][0], "http") == SGLANG_PORT


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_sglang_deployments_run_the_launchers_plan(rendered: dict[Any, Any], steps: int) -> None:
    container = _container(rendered[("Deployment", f"sglang-steps{steps}")])
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["args"] == _expected_args(steps)
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # --tp-size 1
    assert container["image"].startswith("lmsysorg/sglang:")


def _compose(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "deploy" / name).read_text())["services"])


def _compose_backends(services: dict[str, Any]) -> list[str]:
    env = services["proxy"]["environment"]
    config = load_config(environ={k: str(v) for k, v in env.items()})
    assert config.policy == Config().policy  # the product's default, as in Kubernetes
    assert set(services["proxy"]["depends_on"]) == {s for s in services if s != "proxy"}
    return [b.url for b in config.backends]


def test_compose_gpu_services_run_the_plan_on_separate_gpus() -> None:
    services = _compose("compose.yaml")
    gpus = set()
    for k in (1, 2, 3):
        service = services[f"sglang-steps{k}"]
        assert service["command"] == ["python3", "-m", "sglang.launch_server", *_expected_args(k)]
        assert f":{SGLANG_PORT}/ready" in " ".join(service["healthcheck"]["test"])
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        gpus.update(device["device_ids"])
    assert len(gpus) == 3
    assert _compose_backends(services) == [
        f"http://sglang-steps{k}:{SGLANG_PORT}" for k in (1, 2, 3)
    ]


def test_compose_emulated_services_are_valid_emulate_commands() -> None:
    services = _compose("compose.emulated.yaml")
    parser = build_parser()
    for k in (1, 2, 3):
        args = parser.parse_args(services[f"sglang-steps{k}"]["command"])
        assert (args.command, args.steps, args.port) == ("emulate", k, SGLANG_PORT)
    assert _compose_backends(services) == [
        f"http://sglang-steps{k}:{SGLANG_PORT}" for k in (1, 2, 3)
    ]


def test_dockerfile_healthcheck_passes_against_a_running_proxy() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) == 2  # build stage, slim runtime
    assert re.search(r"^USER 10001$", text, re.MULTILINE)
    match = re.search(r"HEALTHCHECK .*\\\n\s+CMD (\[.*\])", text)
    assert match, "no exec-form HEALTHCHECK"
    command = json.loads(match.group(1))
    assert command[0] == "python"
    assert "/health" in command[-1]
    port = free_port()
    with run_server(["serve", "--backend", "http://127.0.0.1:9"], port=port, ready_path=None):
        env = {**os.environ, "SPECROUTE_PORT": str(port)}
        check = subprocess.run([sys.executable, *command[1:]], env=env, timeout=30, check=False)
    assert check.returncode == 0
