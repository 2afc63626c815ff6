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
from servers import run_server

from specroute.cli import build_parser
from specroute.config import Config, load_config
from specroute.launch.argv import LaunchOptions, sglang_server_args

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
FOLLOWS_LOAD = ROOT / "deploy" / "depth-follows-load"
MODEL = "/models/model"
SGLANG_PORT = 30000


def _expected_args(steps: int) -> list[str]:
    """What `specroute launch --model /models/model --host 0.0.0.0` plans for this depth."""
    options = LaunchOptions(model=MODEL, steps=(1, 2, 3), host="0.0.0.0")
    return sglang_server_args(options, steps, SGLANG_PORT)


def _render_by_hand(directory: Path) -> list[dict[str, Any]]:
    """The part of kustomize these manifests use: resources (files or directories),
    components, and common labels (which apply to everything below them)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    labels: dict[str, str] = {}
    for entry in kustomization.get("labels", []):
        labels.update(entry["pairs"])
    docs = []
    for resource in [*kustomization.get("resources", []), *kustomization.get("components", [])]:
        path = directory / resource
        found = (
            _render_by_hand(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
        )
        for doc in found:
            doc["metadata"].setdefault("labels", {}).update(labels)
            docs.append(doc)
    return docs


def _render(directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """`kubectl kustomize` where available (checked against the hand rendering), else by hand."""
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        out = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True
        ).stdout
        docs = list(yaml.safe_load_all(out))
        assert len(docs) == len(_render_by_hand(directory))
    else:
        docs = _render_by_hand(directory)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict[str, Any]]:
    return _render(KUSTOMIZE)


@pytest.fixture(scope="module")
def follows_load() -> dict[tuple[str, str], dict[str, Any]]:
    """The pool with depth 0, the planner and KEDA (deploy/depth-follows-load)."""
    return _render(FOLLOWS_LOAD)


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
        ("Service", "specroute-replicas"),
        ("Service", "sglang"),
        ("Deployment", "sglang-steps1"),
        ("Deployment", "sglang-steps2"),
        ("Deployment", "sglang-steps3"),
    }
    for doc in rendered.values():
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"


def test_proxy_replicas_find_each_other_through_a_headless_service_over_their_pods(
    rendered: dict[tuple[str, str], Any], tmp_path: Path
) -> None:
    (url,) = _proxy_config(rendered, tmp_path).replicas.peers
    host, port = url.removeprefix("http://").split(":")
    service = rendered[("Service", host)]["spec"]
    proxy = rendered[("Deployment", "specroute")]
    assert service["clusterIP"] == "None"  # one address per pod, not one virtual IP
    assert service["selector"] == proxy["spec"]["template"]["metadata"]["labels"]
    assert int(port) == _port(_container(proxy), "http")


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
    with run_server(["serve", "--backend", "http://127.0.0.1:9"], ready_path=None) as proxy:
        env = {**os.environ, "SPECROUTE_PORT": str(proxy.port)}
        check = subprocess.run([sys.executable, *command[1:]], env=env, timeout=30, check=False)
    assert check.returncode == 0


# Depth follows load: one Deployment per depth, the planner, KEDA ------------------------

SCALED_OBJECT = {
    # The fields of KEDA's ScaledObject (keda.sh/v1alpha1) these manifests use, as its CRD
    # types them: a trigger's metadata values are strings.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer"},
                "cooldownPeriod": {"type": "integer"},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer"},
                        "replicas": {"type": "integer"},
                    },
                },
                "advanced": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("which", [KUSTOMIZE, FOLLOWS_LOAD], ids=["base", "depth-follows-load"])
def test_every_rendered_manifest_passes_its_schema(which: Path) -> None:
    import jsonschema
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    for (kind, _name), doc in _render(which).items():
        if kind == "ScaledObject":
            jsonschema.validate(doc, SCALED_OBJECT)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_depth_follows_load_adds_depth_0_the_planner_and_a_scaler_per_depth(
    follows_load: dict[tuple[str, str], Any], rendered: dict[tuple[str, str], Any]
) -> None:
    added = set(follows_load) - set(rendered)
    assert added == {
        ("Deployment", "sglang-steps0"),
        ("Deployment", "specroute-planner"),
        *(("ScaledObject", f"sglang-steps{k}") for k in range(4)),
    }


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_each_depths_deployment_runs_the_launchers_plan(
    follows_load: dict[tuple[str, str], Any], steps: int
) -> None:
    deployment = follows_load[("Deployment", f"sglang-steps{steps}")]
    assert _container(deployment)["args"] == _expected_args(steps)
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["specroute/steps"] == str(steps)
    # On scale-down the pod waits for its running requests before SGLang stops.
    assert "num_running_reqs" in " ".join(
        _container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    )
    assert pod["spec"]["terminationGracePeriodSeconds"] > 90


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_keda_scales_each_depth_to_the_replicas_the_plan_exports(
    follows_load: dict[tuple[str, str], Any], steps: int
) -> None:
    from specroute.planner import Setting
    from specroute.reconfigure.loop import replicas

    spec = follows_load[("ScaledObject", f"sglang-steps{steps}")]["spec"]
    target = follows_load[("Deployment", spec["scaleTargetRef"]["name"])]
    label = target["spec"]["template"]["metadata"]["labels"]["specroute/steps"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    # The label value is the key the plan document (and so the metric) uses for this depth.
    (key,) = replicas([Setting(steps=steps)])
    assert label == key
    assert trigger["metadata"]["query"] == f'max(specroute_plan_replicas{{steps="{key}"}})'
    assert trigger["metadata"]["threshold"] == "1"  # replicas = the metric's value
    assert trigger["metadata"]["ignoreNullValues"] == "false"  # no plan is no reason for 0
    assert spec["minReplicaCount"] == 0


def test_the_planner_is_one_advisor_sharing_the_proxies_admin_key(
    follows_load: dict[tuple[str, str], Any],
) -> None:
    from specroute.reconfigure.advisor import _parser

    planner = follows_load[("Deployment", "specroute-planner")]
    assert planner["spec"]["replicas"] == 1
    container = _container(planner)
    assert container["command"] == ["python", "-m", "specroute.reconfigure.advisor"]
    args = _parser().parse_args(container["args"])
    host, _, port = args.replicas.rpartition(":")
    replicas = follows_load[("Service", host)]["spec"]
    assert replicas["clusterIP"] == "None"
    proxy = follows_load[("Deployment", "specroute")]
    assert replicas["selector"] == proxy["spec"]["template"]["metadata"]["labels"]
    assert int(port) == _port(_container(proxy), "http")
    secret = container["env"][0]["valueFrom"]["secretKeyRef"]
    proxy_secret = _container(proxy)["env"][0]["valueFrom"]["secretKeyRef"]
    assert (secret["name"], secret["key"]) == (proxy_secret["name"], proxy_secret["key"])
    assert (
        container["env"][0]["name"] == _container(proxy)["env"][0]["name"] == "SPECROUTE_ADMIN_KEY"
    )
