"""``fourm-kfp doctor`` against the emulated API server (tests/cluster/apiserver_emulator.py: CRDs served only when
Established, SelfSubjectAccessReview decided from the RBAC objects it holds, impersonation), the KFP API emulator,
the real S3 server of the tests (rclone) and a real MLflow tracking server.

A healthy setup (the manifests' RBAC, Secret, ConfigMap and pull secret, the CRDs of tests/schemas, our Trainer
runtime, a LocalQueue and Kueue's Configuration) passes every check and leaves the cluster as it was; each object
removed fails its check, naming the object and the command that fixes it."""

from __future__ import annotations

import base64
import socket
import time

import pytest
import yaml

from fourm_kfp.pipeline_runs import doctor
from fourm_kfp.pipeline_runs.doctor import FAIL, OK, SKIPPED, WARN, DoctorRequest, run_doctor, run_parameters
from fourm_kfp.pipeline_runs.doctor_cluster import KUEUE_CONFIG_KEY, KUEUE_CONFIG_MAP, KUEUE_NAMESPACE, launcher_rules
from fourm_kfp.cluster.kube import KubeApi
from fourm_kfp.pipeline_runs.kfp_api import make_client
from tests.cluster.apiserver_emulator import ADMIN_TOKEN, RBAC, load_crd
from tests.cluster.kube_emulator import EmulatedCluster
from tests.evaluation.test_model_gate import _server_missing, tracking_server  # noqa: F401 (a fixture)
from tests.kfp_api_emulator import KfpApiEmulator

NAMESPACE, ACCOUNT, QUEUE = "fourm", "fourm-pipeline-runner", "team-gpus"
KEY_ID, SECRET_KEY = "AKIA-doctor-test-key-id", "doctor-test-secret-access-key"  # the Secret's values: never shown
RUNTIMES = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")
#: The LocalQueue API as Kueue 0.14-0.19 serve it (config/components/crd/bases/kueue.x-k8s.io_localqueues.yaml:
#: v1beta1 served; only the names, scope and versions matter to the API server's routing).
LOCAL_QUEUE_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "localqueues.kueue.x-k8s.io"},
                   "spec": {"group": "kueue.x-k8s.io", "scope": "Namespaced",
                            "names": {"plural": "localqueues", "kind": "LocalQueue"},
                            "versions": [{"name": "v1beta1", "served": True, "storage": False},
                                         {"name": "v1beta2", "served": True, "storage": True}]},
                   "status": {"conditions": [{"type": "Established", "status": "True"}]}}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _kueue_configuration(frameworks: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": KUEUE_CONFIG_MAP},
            "data": {KUEUE_CONFIG_KEY: yaml.safe_dump({"apiVersion": "config.kueue.x-k8s.io/v1beta2",
                                                       "kind": "Configuration",
                                                       "integrations": {"frameworks": frameworks}})}}


def healthy(cluster: EmulatedCluster, s3_endpoint: str, tracking: str) -> None:
    """What manifests/ and the prerequisites put in the cluster."""
    admin = cluster.admin()
    core, custom = admin.core, admin.custom
    from kubernetes import client

    rbac, extensions = client.RbacAuthorizationV1Api(admin.api_client), client.ApiextensionsV1Api(admin.api_client)
    for document in yaml.safe_load_all(RBAC.read_text()):
        document["metadata"]["namespace"] = NAMESPACE
        {"ServiceAccount": lambda d: core.create_namespaced_service_account(NAMESPACE, d),
         "Role": lambda d: rbac.create_namespaced_role(NAMESPACE, d),
         "RoleBinding": lambda d: rbac.create_namespaced_role_binding(NAMESPACE, d)}[document["kind"]](document)
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "fourm-s3-credentials"}, "type": "Opaque",
                                              "data": {"AWS_ACCESS_KEY_ID": _b64(KEY_ID),
                                                       "AWS_SECRET_ACCESS_KEY": _b64(SECRET_KEY)}})
    core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "fourm-settings"},
                                                  "data": {"AWS_ENDPOINT_URL": s3_endpoint,
                                                           "MLFLOW_TRACKING_URI": tracking}})
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "fourm-image-pull"},
                                              "type": "kubernetes.io/dockerconfigjson",
                                              "data": {".dockerconfigjson": _b64('{"auths": {}}')}})
    extensions.create_custom_resource_definition(load_crd("/".join(RUNTIMES)), _preload_content=False)
    extensions.create_custom_resource_definition(LOCAL_QUEUE_CRD, _preload_content=False)
    custom.create_cluster_custom_object(*RUNTIMES, {"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                    "kind": "ClusterTrainingRuntime",
                                                    "metadata": {"name": "fourm-torch-distributed"}, "spec": {}})
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NAMESPACE, "localqueues",
                                           {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                                            "metadata": {"name": QUEUE}, "spec": {"clusterQueue": "gpus"}})
    core.create_namespaced_config_map(KUEUE_NAMESPACE, _kueue_configuration(
        ["batch/job", "kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob"]))


@pytest.fixture(scope="module")
def kfp():
    emulator = KfpApiEmulator()
    yield emulator
    emulator.close()


@pytest.fixture
def cluster():
    emulated = EmulatedCluster(NAMESPACE)
    yield emulated
    emulated.close()


@pytest.fixture
def setup(cluster, s3_env, s3_uri, tracking_server, kfp):  # noqa: F811 (the fixture imported above)
    """A healthy cluster; the doctor's request, its client (a user's kubeconfig: the admin here) and the KFP
    client."""
    if _server_missing():
        pytest.skip(_server_missing())
    healthy(cluster, s3_env.endpoint, tracking_server)
    request = DoctorRequest(namespace=NAMESPACE, service_account=ACCOUNT, host=kfp.url, parameters=run_parameters(
        {"pretrain_launcher": "pytorchjob", "train_tokenizers_launcher": "trainjob", "store_uri": s3_uri,
         "scheduler": f"kueue:{QUEUE}:pytorchjob-integration-on"}))
    kube = KubeApi(cluster._client(ADMIN_TOKEN).api_client, NAMESPACE)
    return cluster, request, kube, make_client(kfp.url)


def _by_name(checks) -> dict:
    return {check.name: check for check in checks}


def _objects(cluster) -> set:
    return {key for key, obj in cluster.emulator._objects.items() if not obj.deleted}


def test_a_healthy_setup_passes_every_check_and_creates_nothing(setup):
    cluster, request, kube, kfp_client = setup
    before = _objects(cluster)
    checks = run_doctor(request, kube, kfp_client)
    assert [(c.name, c.state) for c in checks if c.state != OK] == [], [c.line() for c in checks]
    assert {c.name for c in checks} >= {"kfp version", "kubernetes", "crd pytorchjob", "crd trainjob", "rbac", "s3 secret",
                                        "settings", "pull secret", "trainer runtime", "kueue queue", "kueue jobs",
                                        "s3", "mlflow"}
    assert doctor.exit_code(checks) == 0
    assert _objects(cluster) == before  # no object created (the SelfSubjectAccessReviews are never stored)
    # every verb the Role grants was asked
    asked = sum(len(r.get("apiGroups") or [""]) * len(r["resources"]) * len(r["verbs"]) for r in launcher_rules())
    assert f"all {asked} things" in _by_name(checks)["rbac"].detail and asked >= 15


def _delete(cluster, kind: str, name: str) -> None:
    from kubernetes import client

    admin = cluster.admin()
    api_client = admin.api_client
    {"crd": lambda: client.ApiextensionsV1Api(api_client).delete_custom_resource_definition(
        name, _preload_content=False),
     "secret": lambda: admin.core.delete_namespaced_secret(name, NAMESPACE),
     "configmap": lambda: admin.core.delete_namespaced_config_map(name, NAMESPACE),
     "rolebinding": lambda: client.RbacAuthorizationV1Api(api_client).delete_namespaced_role_binding(name, NAMESPACE),
     "runtime": lambda: admin.custom.delete_cluster_custom_object(*RUNTIMES, name),
     "localqueue": lambda: admin.custom.delete_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NAMESPACE,
                                                                       "localqueues", name)}[kind]()


@pytest.mark.parametrize("kind,name,check,named,fix", [
    ("crd", "pytorchjobs.kubeflow.org", "crd pytorchjob", "pytorchjobs.kubeflow.org", "training-operator"),
    ("crd", "trainjobs.trainer.kubeflow.org", "crd trainjob", "trainjobs.trainer.kubeflow.org", "kubeflow/trainer"),
    ("rolebinding", "fourm-pipeline-runner", "rbac", "create pytorchjobs.kubeflow.org", "kubectl apply -k"),
    ("secret", "fourm-s3-credentials", "s3 secret", "fourm-s3-credentials",
     "create secret generic fourm-s3-credentials --from-env-file"),
    ("runtime", "fourm-torch-distributed", "trainer runtime", "fourm-torch-distributed",
     "manifests/cluster/trainer-runtimes.yaml"),
    ("localqueue", QUEUE, "kueue queue", f"LocalQueue {QUEUE}", '"kind": "LocalQueue"'),
])
def test_each_object_removed_fails_its_check_naming_it_and_the_fix(setup, kind, name, check, named, fix):
    cluster, request, kube, kfp_client = setup
    _delete(cluster, kind, name)
    found = _by_name(run_doctor(request, kube, kfp_client))
    assert found[check].state == FAIL, found[check].line()
    assert named in found[check].detail and fix in found[check].fix
    shown = "\n".join(c.line() for c in found.values())
    assert KEY_ID not in shown and SECRET_KEY not in shown and _b64(SECRET_KEY) not in shown
    failed = [c.name for c in found.values() if c.state == FAIL]
    assert failed == [check], [c.line() for c in found.values() if c.state == FAIL]


def test_one_verb_missing_from_the_role_is_named(setup):
    from kubernetes import client

    cluster, request, kube, kfp_client = setup
    rbac = client.RbacAuthorizationV1Api(cluster.admin().api_client)
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role")
    for rule in role["rules"]:
        if rule["resources"] == ["pods"] and "watch" in rule["verbs"]:
            rule["verbs"].remove("watch")
    rbac.delete_namespaced_role("fourm-pipeline-runner", NAMESPACE)
    rbac.create_namespaced_role(NAMESPACE, role)
    found = _by_name(run_doctor(request, kube, kfp_client))["rbac"]
    assert found.state == FAIL and "may not watch pods in namespace" in found.detail, found.line()
    assert f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}" in found.detail


def test_a_caller_that_may_not_impersonate_the_account_is_told_so(setup):
    cluster, request, _, kfp_client = setup
    launcher = cluster.api()  # the launcher's own token: no impersonate right
    found = _by_name(run_doctor(request, launcher, kfp_client))["rbac"]
    assert found.state == FAIL and "impersonate" in found.detail and "403" in found.detail, found.line()


def test_optional_objects_absent_are_warnings_that_say_what_goes_missing(setup):
    cluster, request, kube, kfp_client = setup
    _delete(cluster, "configmap", "fourm-settings")
    _delete(cluster, "secret", "fourm-image-pull")
    found = _by_name(run_doctor(request, kube, kfp_client))
    assert found["settings"].state == WARN and "AWS_ENDPOINT_URL" in found["settings"].detail
    assert found["pull secret"].state == WARN and "only public images" in found["pull secret"].detail


def test_a_pull_secret_of_the_wrong_type_fails(setup):
    cluster, request, kube, kfp_client = setup
    _delete(cluster, "secret", "fourm-image-pull")
    cluster.admin().core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "fourm-image-pull"},
                                                              "type": "Opaque", "data": {"token": _b64("x")}})
    found = _by_name(run_doctor(request, kube, kfp_client))["pull secret"]
    assert found.state == FAIL and "kubernetes.io/dockerconfigjson" in found.detail
    assert "create secret docker-registry fourm-image-pull" in found.fix


def test_kueue_without_the_pytorchjob_integration_fails_and_names_it(setup):
    cluster, request, kube, kfp_client = setup
    core = cluster.admin().core
    core.delete_namespaced_config_map(KUEUE_CONFIG_MAP, KUEUE_NAMESPACE)
    # Kueue 0.19's own default list (config/components/manager/controller_manager_config.yaml): no PyTorchJob
    core.create_namespaced_config_map(KUEUE_NAMESPACE, _kueue_configuration(
        ["batch/job", "kubeflow.org/mpijob", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob", "pod"]))
    found = _by_name(run_doctor(request, kube, kfp_client))["kueue jobs"]
    assert found.state == FAIL and "kubeflow.org/pytorchjob" in found.detail
    assert "trainer.kubeflow.org/trainjob" not in found.detail and "rollout restart" in found.fix


def test_a_crd_that_does_not_serve_the_rendered_version_fails_and_the_api_404s(setup):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cluster, request, kube, kfp_client = setup
    extensions = client.ApiextensionsV1Api(cluster.admin().api_client)
    crd = load_crd("kubeflow.org/v1/pytorchjobs")
    for version in crd["spec"]["versions"]:
        version["served"] = False
    extensions.delete_custom_resource_definition("pytorchjobs.kubeflow.org", _preload_content=False)
    extensions.create_custom_resource_definition(crd, _preload_content=False)
    found = _by_name(run_doctor(request, kube, kfp_client))["crd pytorchjob"]
    assert found.state == FAIL and "does not serve kubeflow.org/v1" in found.detail
    with pytest.raises(ApiException) as error:  # and the API server serves no PyTorchJobs then
        cluster.admin().custom.list_namespaced_custom_object("kubeflow.org", "v1", NAMESPACE, "pytorchjobs")
    assert error.value.status == 404


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_s3_endpoint_fails_fast_naming_it(setup):
    cluster, request, kube, kfp_client = setup
    dead = f"http://127.0.0.1:{_dead_port()}"
    started = time.monotonic()
    found = _by_name(run_doctor(DoctorRequest(**{**request.__dict__, "s3_endpoint": dead}), kube, kfp_client))["s3"]
    assert found.state == FAIL and dead in found.detail, found.line()
    assert time.monotonic() - started < 30


def test_a_dead_mlflow_uri_fails_naming_it(setup):
    cluster, request, kube, kfp_client = setup
    dead = f"http://127.0.0.1:{_dead_port()}"
    found = _by_name(run_doctor(DoctorRequest(**{**request.__dict__, "tracking_uri": dead}), kube, kfp_client))
    assert found["mlflow"].state == FAIL and dead in found["mlflow"].detail
    assert found["s3"].state == OK


@pytest.mark.parametrize("tag,state", [("2.14.0", FAIL), ("2.15.0", OK), ("2.16.1", OK), ("2.17.0", OK),
                                       ("2.18.0", WARN), ("unknown", WARN)])
def test_the_kfp_version_against_the_supported_list(tag, state):
    from fourm_kfp.pipeline_runs.doctor_services import check_kfp_version

    emulator = KfpApiEmulator(tag_name=tag)
    try:
        found = check_kfp_version(make_client(emulator.url), emulator.url)
    finally:
        emulator.close()
    assert found.state == state, found.line()


def test_without_a_cluster_the_cluster_checks_are_skipped_with_why():
    checks = run_doctor(DoctorRequest(parameters={"store_uri": "/tmp/store"}), None, None, "no kubeconfig")
    found = _by_name(checks)
    assert found["kubernetes"].state == SKIPPED and "no kubeconfig" in found["kubernetes"].detail
    assert found["s3"].state == SKIPPED and doctor.exit_code(checks) == 0


@pytest.mark.parametrize("problem", ["dead", "bad token"])
def test_an_api_server_that_does_not_answer_or_refuses_the_credentials_fails_once(setup, problem):
    from kubernetes import client

    from fourm_kfp.cluster.kube import api_retries

    cluster, request, kube, kfp_client = setup
    configuration = kube.api_client.configuration
    host = f"http://127.0.0.1:{_dead_port()}" if problem == "dead" else configuration.host
    token = "not-a-token" if problem == "bad token" else ADMIN_TOKEN
    broken = KubeApi.connect(client.Configuration(host=host, api_key={"authorization": token},
                                                  api_key_prefix={"authorization": "Bearer"}),
                             NAMESPACE, api_retries(attempts=0))
    checks = run_doctor(request, broken, kfp_client)
    found = _by_name(checks)
    assert found["kubernetes"].state == FAIL and host in found["kubernetes"].detail, found["kubernetes"].line()
    assert ("401" in found["kubernetes"].detail) == (problem == "bad token")
    assert "rbac" not in found and found["s3"].state == OK  # no cluster check ran; the services were still asked


def test_an_irsa_role_on_the_runs_account_stands_in_for_the_s3_secret(setup):
    """On EKS the pods get S3 credentials from their ServiceAccount's IAM role: with no Secret, the account's
    ``eks.amazonaws.com/role-arn`` passes the check; without either, the fix names both ways."""
    cluster, request, kube, kfp_client = setup
    role = "arn:aws:iam::123456789012:role/fourm-s3"
    _delete(cluster, "secret", "fourm-s3-credentials")
    found = _by_name(run_doctor(request, kube, kfp_client))["s3 secret"]
    assert found.state == FAIL and f"ServiceAccount {ACCOUNT} has no eks.amazonaws.com/role-arn" in found.detail
    assert f"annotate serviceaccount {ACCOUNT} eks.amazonaws.com/role-arn=" in found.fix
    core = cluster.admin().core
    core.delete_namespaced_service_account(ACCOUNT, NAMESPACE)
    core.create_namespaced_service_account(NAMESPACE, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
        "name": ACCOUNT, "annotations": {"eks.amazonaws.com/role-arn": role}}})
    checks = run_doctor(request, kube, kfp_client)
    found = _by_name(checks)["s3 secret"]
    assert found.state == OK and role in found.detail and "IRSA" in found.detail, found.line()
    assert [c.line() for c in checks if c.state == FAIL] == []
