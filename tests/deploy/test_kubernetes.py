"""The Kubernetes manifests (deploy/kubernetes): rendered with ``kubectl kustomize``, every object
validated strictly against the Kubernetes schemas (kubernetes-validate, offline), and held to
the service's own facts: its routes, the Dockerfile, the memory budget (service.http.budget), the
graceful stop, the BLAS-thread rule, and the security the image was built for.

Without kubectl these tests skip, unless REQUIRE_KUBECTL is set: then they fail.
"""

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from service.config import Settings
from service.http.app import create_app
from service.http.budget import cost_bytes, worker_budget

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = {"base": KUBERNETES / "base", "example-overlay": KUBERNETES / "overlays/example"}
OVERLAYS = ["example-overlay"]
# Schemas to validate against: the oldest Kubernetes the manifests support, and a newer one
SCHEMA_VERSIONS = ["1.30", "1.33"]
CONTAINER = "attention"  # the service's container in the pod
MIN_BUDGET = 1 << 30  # the derived memory budget must be at least 1 GiB
STOP_SLACK_SECONDS = 5  # the grace period beyond the preStop pause and the graceful stop
KUBERNETES_DEFAULT_GRACE_SECONDS = 30
Obj = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# rendering


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        reason = "kubectl is not installed: the manifests cannot be rendered (kubectl kustomize)"
        if os.environ.get("REQUIRE_KUBECTL"):
            pytest.fail(reason + ", and REQUIRE_KUBECTL is set")
        pytest.skip(reason + " (set REQUIRE_KUBECTL=1 to fail instead)")
    return kubectl


@cache
def _render(directory: Path) -> tuple[Obj, ...]:
    done = subprocess.run(
        [_kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc is not None)


@dataclass(frozen=True)
class Rendered:
    """The objects one kustomization renders, with accessors for the ones the tests look at."""

    name: str
    objects: tuple[Obj, ...]

    def one(self, kind: str) -> Obj:
        found = [o for o in self.objects if o["kind"] == kind]
        assert len(found) == 1, f"{self.name}: expected one {kind}, found {len(found)}"
        return found[0]

    @property
    def deployment(self) -> Obj:
        return self.one("Deployment")

    @property
    def pod(self) -> Obj:
        spec: Obj = self.deployment["spec"]["template"]["spec"]
        return spec

    @property
    def pod_labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.deployment["spec"]["template"]["metadata"].get("labels", {})
        return labels

    @property
    def container(self) -> Obj:
        found: list[Obj] = [c for c in self.pod["containers"] if c["name"] == CONTAINER]
        assert len(found) == 1, f"{self.name}: no container named {CONTAINER!r} in the pod"
        return found[0]

    @property
    def env(self) -> dict[str, str]:
        """The container's literal environment (a variable from valueFrom cannot be checked)."""
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            assert "value" in var, (
                f"{self.name}: {var['name']} comes from valueFrom; the tests can only check "
                "literal values"
            )
            env[var["name"]] = var["value"]
        return env

    @property
    def settings(self) -> Settings:
        """The service's settings as the container reads them: only the manifest's ATTENTION_*
        variables, nothing from the environment the tests run in."""
        outside = {k: v for k, v in os.environ.items() if not k.startswith("ATTENTION_")}
        ours = {k: v for k, v in self.env.items() if k.startswith("ATTENTION_")}
        with mock.patch.dict(os.environ, outside | ours, clear=True):
            return Settings()

    @property
    def container_port(self) -> int:
        ports = self.container["ports"]
        assert len(ports) == 1, f"{self.name}: expected one container port, found {len(ports)}"
        port: int = ports[0]["containerPort"]
        return port

    def resolve_port(self, port: int | str) -> int:
        """A port given by number or by the container port's name, as a number."""
        if isinstance(port, int):
            return port
        names = {p.get("name"): p["containerPort"] for p in self.container["ports"]}
        assert port in names, f"{self.name}: no container port named {port!r}"
        number: int = names[port]
        return number


@pytest.fixture(scope="module", params=list(KUSTOMIZATIONS), ids=list(KUSTOMIZATIONS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    name: str = request.param
    return Rendered(name, _render(KUSTOMIZATIONS[name]))


@pytest.fixture(scope="module")
def get_routes() -> set[str]:
    """The paths the app answers with GET."""

    def leaves(routes: list[Any]) -> Iterator[Any]:
        for route in routes:  # FastAPI wraps each included router's routes in one route
            inner = getattr(route, "original_router", None)
            yield from leaves(inner.routes) if inner is not None else [route]

    app = create_app(Settings())
    return {
        route.path
        for route in leaves(list(app.routes))
        if "GET" in (getattr(route, "methods", None) or ())
    }


# ---------------------------------------------------------------------------------------------
# helpers


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def quantity(value: str | int | float) -> Fraction:
    """A Kubernetes resource quantity ("2", "500m", "2Gi", "1e9") as an exact number."""
    match = _QUANTITY.match(str(value))
    assert match is not None and match[2] in _SUFFIXES, f"not a quantity: {value!r}"
    return Fraction(match[1]) * _SUFFIXES[match[2]]


def test_quantity_parses_kubernetes_notation() -> None:
    assert quantity("2") == 2
    assert quantity("500m") == Fraction(1, 2)
    assert quantity("2Gi") == 2 * 2**30
    assert quantity("1.5G") == 1_500_000_000
    assert quantity("1e3") == 1000
    assert quantity(3) == 3


def _scaled(value: int | str, total: int) -> int:
    """A PodDisruptionBudget's int-or-percent at ``total`` pods (percentages round up, as the
    disruption controller does)."""
    if isinstance(value, int):
        return value
    assert value.endswith("%"), f"not an int or a percentage: {value!r}"
    return -(-int(value[:-1]) * total // 100)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (matchLabels only) selects these labels."""
    assert not selector.get("matchExpressions"), "matchExpressions: keep selectors to matchLabels"
    match: Mapping[str, str] = selector.get("matchLabels", {})
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def _dockerfile() -> str:
    """The Dockerfile with its continuation lines joined."""
    return (ROOT / "Dockerfile").read_text().replace("\\\n", " ")


def _prestop_pause(container: Obj) -> int:
    """Seconds the preStop hook pauses: the native sleep action or an exec of sleep."""
    pre_stop = container.get("lifecycle", {}).get("preStop")
    assert pre_stop is not None, "no preStop hook: SIGTERM would arrive while traffic still comes"
    if "sleep" in pre_stop:
        seconds: int = pre_stop["sleep"]["seconds"]
        return seconds
    command = pre_stop.get("exec", {}).get("command", [])
    assert len(command) == 2 and command[0] in ("/bin/sleep", "sleep", "/usr/bin/sleep"), (
        f"preStop is not a plain pause (sleep N): {pre_stop}"
    )
    return int(command[1])


# ---------------------------------------------------------------------------------------------
# the objects are valid Kubernetes


@pytest.mark.parametrize("version", SCHEMA_VERSIONS, ids=[f"k8s-{v}" for v in SCHEMA_VERSIONS])
def test_every_object_validates_strictly(rendered: Rendered, version: str) -> None:
    assert rendered.objects, f"{rendered.name} renders nothing"
    for obj in rendered.objects:
        where = f"{rendered.name}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            used = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{where} is invalid for Kubernetes {version} at {path}: {error.message}")
        except (
            kubernetes_validate.SchemaNotFoundError,
            kubernetes_validate.InvalidSchemaError,
            kubernetes_validate.utils.VersionNotSupportedError,
        ) as error:
            pytest.fail(f"{where}: {error.message}")
        assert used == version, f"kubernetes-validate has no {version} schemas (used {used})"


def test_renders_the_expected_objects(rendered: Rendered) -> None:
    kinds = sorted(o["kind"] for o in rendered.objects if o["kind"] != "Namespace")
    assert kinds == sorted(
        [
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
        ]
    )
    namespaces = {
        o["metadata"].get("namespace") for o in rendered.objects if o["kind"] != "Namespace"
    }
    assert len(namespaces) == 1, f"the objects are spread over namespaces {namespaces}"
    for obj in rendered.objects:
        if obj["kind"] != "Namespace":
            labels = obj["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/name") == "attention-service", (
                f"{obj['kind']} lacks the common labels"
            )


# ---------------------------------------------------------------------------------------------
# the pod against the service


def test_probes_use_real_get_routes_on_the_container_port(
    rendered: Rendered, get_routes: set[str]
) -> None:
    container = rendered.container
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": None}
    for probe_name, path in expected.items():
        probe = container.get(probe_name)
        assert probe is not None, f"{rendered.name}: no {probe_name}"
        http = probe.get("httpGet")
        assert http is not None, f"{probe_name} is not an HTTP GET"
        assert http["path"] in get_routes, (
            f"{probe_name} asks {http['path']}, which the app does not answer with GET"
        )
        if path is not None:
            assert http["path"] == path, f"{probe_name} must ask {path}, not {http['path']}"
        assert http.get("scheme", "HTTP") == "HTTP", f"{probe_name}: the service speaks HTTP"
        assert rendered.resolve_port(http["port"]) == rendered.container_port, (
            f"{probe_name} asks port {http['port']}, not the container's {rendered.container_port}"
        )


def test_image_port_and_user_match_the_dockerfile(rendered: Rendered) -> None:
    dockerfile = _dockerfile()
    built = re.search(r"docker build -t ([\w./-]+)", dockerfile)
    expose = re.search(r"^EXPOSE (\d+)", dockerfile, re.M)
    port_env = re.search(r"\bATTENTION_PORT=(\d+)", dockerfile)
    user = re.search(r"^USER (\d+):(\d+)", dockerfile, re.M)
    assert built and expose and port_env and user, "the Dockerfile no longer says these facts"

    image = rendered.container["image"].split("@")[0]
    repository = re.sub(r":[\w.-]+$", "", image)  # less the tag (a registry's :port stays)
    assert repository.rsplit("/", 1)[-1] == built[1], (
        f"the pod runs {image}, not the image the Dockerfile builds ({built[1]})"
    )
    listens = int(rendered.env.get("ATTENTION_PORT", port_env[1]))
    assert int(expose[1]) == int(port_env[1]), "the Dockerfile's EXPOSE and ATTENTION_PORT differ"
    assert rendered.container_port == listens, (
        f"containerPort {rendered.container_port}, but the service listens on {listens}"
    )
    context = {**rendered.pod.get("securityContext", {}), **rendered.container["securityContext"]}
    assert context.get("runAsUser") == int(user[1]), f"runAsUser is not the image's {user[1]}"
    assert context.get("runAsGroup") == int(user[2]), f"runAsGroup is not the image's {user[2]}"


def test_every_attention_variable_is_a_setting(rendered: Rendered) -> None:
    """A misspelt ATTENTION_* variable would be ignored silently (Settings: extra="ignore")."""
    for name in rendered.env:
        if name.startswith("ATTENTION_"):
            field = name.removeprefix("ATTENTION_").lower()
            assert field in Settings.model_fields, f"{name} is not a setting (README: Settings)"


def test_resources_fit_the_one_worker_rule(rendered: Rendered) -> None:
    resources = rendered.container.get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for resource in ("cpu", "memory"):
        assert resource in requests, f"no {resource} request"
        assert resource in limits, f"no {resource} limit"
        assert quantity(limits[resource]) >= quantity(requests[resource]), (
            f"{resource} limit {limits[resource]} is below its request {requests[resource]}"
        )
    cpu = quantity(limits["cpu"])
    assert cpu >= 1 and cpu.denominator == 1, (
        f"the CPU limit {limits['cpu']} is not a whole number of CPUs: BLAS threads are the "
        "CPU quota ÷ workers, rounded down"
    )
    assert rendered.env.get("ATTENTION_WORKERS") == "1", "one worker per pod: scale by replicas"


def test_memory_limit_leaves_a_budget_for_the_largest_request(rendered: Rendered) -> None:
    settings = rendered.settings
    limit = int(quantity(rendered.container["resources"]["limits"]["memory"]))
    mounted = {m["name"] for m in rendered.container.get("volumeMounts", [])}
    in_memory = 0  # tmpfs volumes count against the memory limit, unseen by the budget
    for volume in rendered.pod.get("volumes", []):
        if "emptyDir" in volume and volume["name"] in mounted:
            empty_dir = volume["emptyDir"] or {}
            assert "sizeLimit" in empty_dir, f"emptyDir {volume['name']} has no sizeLimit"
            if empty_dir.get("medium") == "Memory":
                in_memory += int(quantity(empty_dir["sizeLimit"]))
    budget = worker_budget(settings, limit=limit)  # what the service will use
    affordable = worker_budget(
        settings.model_copy(update={"memory_budget_bytes": None}), limit=limit - in_memory
    )
    assert budget <= affordable, (
        f"the budget {budget / 2**20:.0f} MiB ignores {in_memory / 2**20:.0f} MiB of tmpfs in the "
        "memory limit: set ATTENTION_MEMORY_BUDGET_BYTES, or use a disk emptyDir"
    )
    largest = cost_bytes(settings.max_computed_numbers)
    assert budget >= MIN_BUDGET, f"the memory budget is {budget / 2**20:.0f} MiB, under 1 GiB"
    assert budget >= largest, (
        f"the memory budget ({budget / 2**20:.0f} MiB) is below the largest request allowed "
        f"({largest / 2**20:.0f} MiB at ATTENTION_MAX_COMPUTED_NUMBERS="
        f"{settings.max_computed_numbers}): it would always get 413"
    )


def test_grace_period_covers_the_pause_and_the_graceful_stop(rendered: Rendered) -> None:
    grace = rendered.pod.get("terminationGracePeriodSeconds", KUBERNETES_DEFAULT_GRACE_SECONDS)
    pause = _prestop_pause(rendered.container)
    assert pause >= 1, "the preStop pause must let the endpoints drop the pod first"
    needed = pause + rendered.settings.graceful_seconds + STOP_SLACK_SECONDS
    assert grace >= needed, (
        f"terminationGracePeriodSeconds {grace} < preStop {pause} s + "
        f"ATTENTION_GRACEFUL_SECONDS {rendered.settings.graceful_seconds} s + "
        f"{STOP_SLACK_SECONDS} s: answers in flight would be killed, not finished"
    )


def test_pod_runs_locked_down(rendered: Rendered) -> None:
    pod, container = rendered.pod, rendered.container
    pod_context = pod.get("securityContext", {})
    context = container.get("securityContext", {})
    effective = {**pod_context, **context}  # the container's settings win

    assert effective.get("runAsNonRoot") is True, "runAsNonRoot"
    assert effective.get("runAsUser", 0) != 0, "runs as root"
    assert context.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem"
    assert context.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation"
    assert context.get("privileged") is not True, "privileged"
    assert "ALL" in context.get("capabilities", {}).get("drop", []), "capabilities: drop ALL"
    assert not context.get("capabilities", {}).get("add"), "capabilities added"
    seccomp = effective.get("seccompProfile", {}).get("type")
    assert seccomp in ("RuntimeDefault", "Localhost"), f"seccompProfile {seccomp}"
    assert pod.get("automountServiceAccountToken") is False, "a service-account token is mounted"
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert pod.get(host) is not True, host
    assert pod.get("enableServiceLinks") is False, (
        "Service links would inject <SERVICE>_PORT variables: a Service named 'attention' "
        "sets ATTENTION_PORT=tcp://…"
    )

    # the temporary directory (Prometheus' multiprocess files) is a writable emptyDir
    tmpdir = rendered.env.get("TMPDIR", "/tmp")
    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    writable = [
        m
        for m in container.get("volumeMounts", [])
        if m["name"] in empty_dirs
        and not m.get("readOnly")
        and (tmpdir == m["mountPath"] or tmpdir.startswith(m["mountPath"].rstrip("/") + "/"))
    ]
    assert writable, f"TMPDIR {tmpdir} is not on a writable emptyDir (the root is read-only)"


def test_prometheus_annotations_name_metrics_on_the_container_port(
    rendered: Rendered, get_routes: set[str]
) -> None:
    annotations = rendered.deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations.get("prometheus.io/path") == "/metrics"
    assert "/metrics" in get_routes
    assert annotations.get("prometheus.io/port") == str(rendered.container_port), (
        f"prometheus.io/port {annotations.get('prometheus.io/port')} is not the container's "
        f"{rendered.container_port}"
    )


# ---------------------------------------------------------------------------------------------
# the objects against each other


def test_selectors_match_the_pods(rendered: Rendered) -> None:
    deployment, labels = rendered.deployment, rendered.pod_labels
    assert _selects(deployment["spec"]["selector"], labels), (
        f"the Deployment's selector {deployment['spec']['selector']} misses its pods {labels}"
    )

    service = rendered.one("Service")
    selector = service["spec"].get("selector", {})
    assert selector and all(labels.get(k) == v for k, v in selector.items()), (
        f"the Service selects {selector}, not the pods {labels}"
    )
    for port in service["spec"]["ports"]:
        assert port.get("name"), "the Service's ports must be named"
        target = port.get("targetPort", port["port"])
        assert rendered.resolve_port(target) == rendered.container_port, (
            f"the Service sends to {target}, not the container's port"
        )

    pdb = rendered.one("PodDisruptionBudget")
    assert _selects(pdb["spec"]["selector"], labels), (
        f"the PodDisruptionBudget selects {pdb['spec']['selector']}, not the pods {labels}"
    )
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"], (
        "the PodDisruptionBudget and the Deployment select differently"
    )

    for spread in rendered.pod.get("topologySpreadConstraints", []):
        assert _selects(spread["labelSelector"], labels), "a topology spread misses the pods"

    account = rendered.one("ServiceAccount")["metadata"]["name"]
    assert rendered.pod.get("serviceAccountName") == account, "the pod's service account"


def test_hpa_scales_the_deployment_on_cpu(rendered: Rendered) -> None:
    hpa, deployment = rendered.one("HorizontalPodAutoscaler"), rendered.deployment
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        deployment["metadata"]["name"],
    ), f"the HPA scales {target}, not the Deployment {deployment['metadata']['name']}"
    metrics = [
        m["resource"]["target"]
        for m in hpa["spec"]["metrics"]
        if m["type"] == "Resource" and m["resource"]["name"] == "cpu"
    ]
    assert metrics and metrics[0]["type"] == "Utilization", "the HPA must watch CPU utilization"
    assert 0 < metrics[0]["averageUtilization"] <= 100
    low, high = hpa["spec"].get("minReplicas", 1), hpa["spec"]["maxReplicas"]
    assert 2 <= low <= high, f"replica bounds {low}..{high}: keep two pods at least"
    replicas = deployment["spec"].get("replicas")
    assert replicas is None or low <= replicas <= high, (
        f"the Deployment's replicas ({replicas}) fight the HPA's bounds {low}..{high}"
    )


def test_pdb_allows_an_eviction_at_the_minimum(rendered: Rendered) -> None:
    spec = rendered.one("PodDisruptionBudget")["spec"]
    counts = {rendered.one("HorizontalPodAutoscaler")["spec"].get("minReplicas", 1)}
    counts.add(rendered.deployment["spec"].get("replicas", 1))
    for pods in sorted(counts):
        if "maxUnavailable" in spec:
            allowed = _scaled(spec["maxUnavailable"], pods)
        else:
            allowed = pods - _scaled(spec["minAvailable"], pods)
        assert allowed >= 1, (
            f"at {pods} pods the PodDisruptionBudget allows no eviction: drains would hang"
        )


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_pins_an_image(name: str) -> None:
    objects = Rendered(name, _render(KUSTOMIZATIONS[name]))
    image = objects.container["image"]
    tag = re.search(r":([\w.-]+)$", image.split("@")[0])
    assert "@sha256:" in image or (tag is not None and tag[1] != "latest"), (
        f"{name} runs {image}: pin a release tag or a digest"
    )
    assert "/" in image.split("@")[0].split(":")[0], f"{name}: name the registry of {image}"
    namespace = objects.deployment["metadata"].get("namespace")
    assert namespace not in (None, "default"), f"{name}: set a namespace"


# ---------------------------------------------------------------------------------------------
# the documented recipe, with kubectl alone

RECIPES = ["README.md", "docs/operations.md", "deploy/kubernetes/README.md"]
SHELL_BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)
# steps that need a container engine or a cluster: the rest runs as the doc has it
NEEDS_A_CLUSTER = ("docker ", "podman ", "kubectl apply ", "kubectl -n ")


def _recipe(doc: str) -> list[str]:
    """The commands of ``doc``'s block that applies an overlay, continued lines joined."""
    text = (ROOT / doc).read_text()
    (block,) = [b for b in SHELL_BLOCK.findall(text) if "kubectl apply -k" in b]
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.parametrize("doc", RECIPES)
def test_the_documented_recipe_sets_the_image_with_kubectl_alone(doc: str, tmp_path: Path) -> None:
    """The Kubernetes recipe as each doc writes it, run in a copy of deploy/ with a PATH that
    holds kubectl and the shell's tools but no standalone kustomize: the overlay it makes
    renders the pushed image and validates strictly."""
    commands = _recipe(doc)
    assert not [c for c in commands if c.split()[0] == "kustomize" or "kustomize edit" in c]
    shutil.copytree(KUBERNETES, tmp_path / "deploy" / "kubernetes")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "cp", "sed", "grep", "cat"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    (tools / "kubectl").symlink_to(_kubectl())
    script = "\n".join(c for c in commands if not c.startswith(NEEDS_A_CLUSTER))
    done = subprocess.run(
        [str(tools / "bash"), "-c", "set -euo pipefail\n" + script],
        cwd=tmp_path, env={"PATH": str(tools), "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{doc}'s recipe failed:\n{script}\n{done.stderr}"
    variables = dict(re.findall(r"\b(IMAGE|TAG)=(\S+)", commands[0]))
    image = f"{variables['IMAGE']}:{variables['TAG']}"
    (overlay,) = re.findall(r"kubectl apply -k (\S+)", "\n".join(commands))
    objects = Rendered(doc, _render(tmp_path / overlay))
    assert objects.container["image"] == image
    assert f"image: {image}" in done.stdout  # what the recipe's own check shows
    for obj in objects.objects:
        kubernetes_validate.validate(obj, SCHEMA_VERSIONS[-1], strict=True)
