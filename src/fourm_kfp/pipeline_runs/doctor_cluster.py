"""The doctor's checks against the Kubernetes API (:mod:`.doctor`): it reads, and asks ``SelfSubjectAccessReview``s,
and creates nothing.

- **CRDs**: ``customresourcedefinitions/<plural>.<group>`` (``apiextensions.k8s.io/v1``) of each job kind the run
  uses, serving the version the launcher renders (the API server serves a custom resource only for a served version
  of an Established CRD: ``apiextensions-apiserver/pkg/apiserver/customresource_handler.go``, ``crdHandler.ServeHTTP``);
  a TrainJob's also with ``spec.runtimePatches`` (Trainer >= v2.2.0, which the job template uses).
- **RBAC**: one ``SelfSubjectAccessReview`` (``authorization.k8s.io/v1``) per verb, resource and API group of the
  Role in ``manifests/base/rbac.yaml`` (read from that file: no second list), in the run's namespace; with a
  service account named, asked as that account by impersonation (``Impersonate-User``), as ``kubectl auth can-i
  --as`` does.
- **Secrets and settings**: the S3 Secret and its two keys (or, for an ``s3://`` store without it, an IAM role on
  the runs' ServiceAccount: its ``eks.amazonaws.com/role-arn`` annotation, IRSA), the settings ConfigMap and the
  image pull secret (a
  ``kubernetes.io/dockerconfigjson`` Secret holding ``.dockerconfigjson``, the only kind the kubelet reads for
  that: ``pkg/credentialprovider/secrets/secrets.go``); the names are the pipeline's.
- **The TrainJob's runtime** (the template's ``runtimeRef``: a ClusterTrainingRuntime unless it says otherwise).
- **Kueue** for ``scheduler=kueue:<queue>``: the LocalQueue (``kueue.x-k8s.io/v1beta1``, served by Kueue 0.14 to
  0.19), and whether ``integrations.frameworks`` of Kueue's Configuration (ConfigMap ``kueue-manager-config`` in
  ``kueue-system``, key ``controller_manager_config.yaml``; ``["batch/job"]`` when empty,
  ``apis/config/v1beta2/defaults.go``) lists each job kind used: Kueue 0.19 leaves ``kubeflow.org/pytorchjob`` out
  (kubernetes-sigs/kueue PR #12606), and Kueue ignores the queue label of a kind it does not integrate.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import yaml

from fourm_kfp.cluster import job_spec
from fourm_kfp.pipeline_runs.doctor_checks import FAIL, OK, SKIPPED, WARN, Check, DoctorRequest
from fourm_kfp.cluster.job_kinds import JOB_KINDS, TRAINJOB
from fourm_kfp.contract.spec import param_prefix

KUEUE_NAMESPACE, KUEUE_CONFIG_MAP, KUEUE_CONFIG_KEY = "kueue-system", "kueue-manager-config", \
    "controller_manager_config.yaml"
KUEUE_DEFAULT_FRAMEWORKS = ["batch/job"]
RUNTIME_PLURALS = {"ClusterTrainingRuntime": "clustertrainingruntimes", "TrainingRuntime": "trainingruntimes"}
APPLY_BASE = "kubectl apply -k manifests/overlays/<your overlay> (or: kubectl apply -k manifests/base -n {ns})"


def launcher_rules() -> list[dict[str, Any]]:
    """The rules of the launcher's Role in ``manifests/base/rbac.yaml``."""
    text = (resources.files("fourm_kfp.manifests") / "base" / "rbac.yaml").read_text()
    [role] = [doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "Role"]
    return role["rules"]


def job_kinds_used(parameters: dict[str, Any]) -> dict[str, list[str]]:
    """Each job kind the run creates and the stages that create it (``<stage>_launcher``)."""
    used: dict[str, list[str]] = {}
    for stage, defaults in job_spec.JOB_STAGES.items():
        launcher = str(parameters.get(f"{param_prefix(stage)}_launcher", defaults.launcher))
        if launcher in job_spec.JOB_LAUNCHERS:
            used.setdefault(launcher, []).append(stage)
    return used


def _read(call, *args) -> dict[str, Any] | None:
    """The object as served, None when it does not exist; other API errors are raised."""
    from kubernetes.client.exceptions import ApiException

    try:
        return json.loads(call(*args, _preload_content=False).data)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _unreadable(name: str, what: str, exc) -> Check:
    return Check(name, SKIPPED, f"cannot read {what}: {getattr(exc, 'status', '')} {getattr(exc, 'reason', exc)}")


def _conditions_true(obj: dict[str, Any]) -> set[str]:
    return {c.get("type") for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def check_api_server(kube) -> Check:
    """The API server answers ``/version`` to these credentials (else no other cluster check runs)."""
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    host = kube.api_client.configuration.host
    try:
        version = json.loads(client.VersionApi(kube.api_client).get_code(_preload_content=False).data)
    except urllib3.exceptions.HTTPError as exc:
        return Check("kubernetes", FAIL, f"cannot reach the API server at {host}: {getattr(exc, 'reason', exc)}",
                     "check KUBECONFIG and its current context (kubectl cluster-info)")
    except ApiException as exc:
        return Check("kubernetes", FAIL, f"the API server at {host} answered {exc.status} {exc.reason}",
                     "renew the kubeconfig's credentials (kubectl auth whoami)")
    return Check("kubernetes", OK, f"API server {host} (Kubernetes {version.get('gitVersion', '?')}), namespace "
                                   f"{kube.namespace!r}")


def check_crds(kube, used: dict[str, list[str]]) -> list[Check]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(kube.api_client)
    checks = []
    for launcher, kind in JOB_KINDS.items():
        name, resource = "crd " + launcher, kind.resource
        if launcher not in used:
            checks.append(Check(name, SKIPPED, f"no stage runs as a {resource.kind}"))
            continue
        crd_name = f"{resource.plural}.{resource.group}"
        fix = kind.install
        try:
            crd = _read(extensions.read_custom_resource_definition, crd_name)
        except ApiException as exc:
            checks.append(_unreadable(name, f"CRD {crd_name}", exc))
            continue
        stages = ", ".join(used[launcher])
        if crd is None:
            checks.append(Check(name, FAIL, f"CRD {crd_name} is not installed ({stages} create {resource.kind}s)",
                                fix))
            continue
        served = {v.get("name"): v for v in crd.get("spec", {}).get("versions") or [] if v.get("served")}
        if resource.version not in served:
            checks.append(Check(name, FAIL, f"CRD {crd_name} does not serve {resource.api_version} (serves "
                                            f"{', '.join(sorted(served)) or 'nothing'})", fix))
        elif not _conditions_true(crd) & {"Established", "NamesAccepted"}:
            checks.append(Check(name, FAIL, f"CRD {crd_name} is not Established", fix))
        elif kind is TRAINJOB and "runtimePatches" not in (
                (served[resource.version].get("schema") or {}).get("openAPIV3Schema", {})
                .get("properties", {}).get("spec", {}).get("properties", {})):
            checks.append(Check(name, FAIL, f"CRD {crd_name} has no spec.runtimePatches: Trainer is older than "
                                            "v2.2.0, which the TrainJob template needs", fix))
        else:
            checks.append(Check(name, OK, f"{crd_name} serves {resource.api_version}"))
    return checks


def check_rbac(kube, service_account: str) -> Check:
    """Every verb of the launcher's Role, asked with a SelfSubjectAccessReview in the namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api_client = kube.api_client
    who = "you (the caller: give --service-account for the runs' account)"
    if service_account:
        who = f"system:serviceaccount:{kube.namespace}:{service_account}"
        api_client = client.ApiClient(kube.api_client.configuration)
        api_client.set_default_header("Impersonate-User", who)
    reviews = client.AuthorizationV1Api(api_client)
    denied, asked = [], 0
    try:
        for rule in launcher_rules():
            for group in rule.get("apiGroups") or [""]:
                for resource in rule["resources"]:
                    plural, _, subresource = resource.partition("/")
                    for verb in rule["verbs"]:
                        attributes = {"namespace": kube.namespace, "verb": verb, "group": group, "resource": plural,
                                      **({"subresource": subresource} if subresource else {})}
                        answer = json.loads(reviews.create_self_subject_access_review(
                            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                             "spec": {"resourceAttributes": attributes}}, _preload_content=False).data)
                        asked += 1
                        if not (answer.get("status") or {}).get("allowed"):
                            denied.append(f"{verb} {resource}{'.' + group if group else ''}")
    except ApiException as exc:
        hint = " (impersonating it needs the impersonate verb on serviceaccounts)" if service_account else ""
        return Check("rbac", FAIL if service_account and exc.status == 403 else SKIPPED,
                     f"cannot ask as {who}: {exc.status} {exc.reason}{hint}",
                     "ask your cluster admin, or run doctor as the runs' account" if service_account else "")
    if denied:
        return Check("rbac", FAIL, f"{who} may not {', '.join(denied)} in namespace {kube.namespace!r} (the Role "
                                   "fourm-pipeline-runner of manifests/base/rbac.yaml grants them)",
                     APPLY_BASE.format(ns=kube.namespace) + "; the runs' account must be a subject of its "
                     "RoleBinding (manifests/README.md, section 2)")
    return Check("rbac", OK, f"{who} may do all {asked} things the launcher's Role grants")


#: The ServiceAccount KFP runs a pipeline's pods as when the run names none (its standalone install's default).
KFP_DEFAULT_ACCOUNT = "pipeline-runner"
#: The annotation by which EKS's pod identity webhook gives a ServiceAccount's pods an IAM role (IRSA).
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"


def _irsa_role(kube, account: str) -> str:
    """The IAM role ARN ``account``'s pods assume through IRSA ("" = none, or the account is absent)."""
    found = _read(kube.core.read_namespaced_service_account, account, kube.namespace)
    return (((found or {}).get("metadata") or {}).get("annotations") or {}).get(IRSA_ANNOTATION, "")


def _object_checks(kube, parameters: dict[str, Any], service_account: str = ""
                   ) -> tuple[list[Check], dict[str, str]]:
    """The S3 Secret (or, in its place, an IAM role for ``service_account``'s pods), the settings ConfigMap
    (returned: its data) and the image pull secret."""
    from kubernetes.client.exceptions import ApiException

    from fourm_kfp.pipelines.fourm_pretrain import S3_SECRET, S3_SECRET_ENV, SETTINGS_CONFIG_MAP

    ns, checks, settings = kube.namespace, [], {}
    store = str(parameters.get("store_uri", ""))
    account = service_account or KFP_DEFAULT_ACCOUNT
    try:
        secret = _read(kube.core.read_namespaced_secret, S3_SECRET, ns)
        missing = sorted(set(S3_SECRET_ENV.values()) - set((secret or {}).get("data") or {}))
        create = (f"kubectl -n {ns} create secret generic {S3_SECRET} --from-env-file=manifests/base/"
                  "s3-credentials.env (or apply the manifests: manifests/README.md, sections 3-4)")
        role = _irsa_role(kube, account) if secret is None and store.startswith("s3://") else ""
        if role:
            checks.append(Check("s3 secret", OK, f"Secret {S3_SECRET} is absent and ServiceAccount {account}'s pods "
                                                 f"assume the IAM role {role} ({IRSA_ANNOTATION}: IRSA)"))
        elif secret is None and store.startswith("s3://"):
            checks.append(Check("s3 secret", FAIL, f"Secret {S3_SECRET} is missing and ServiceAccount {account} has "
                                                   f"no {IRSA_ANNOTATION}: the steps and jobs would have no S3 "
                                                   f"credentials for {store}",
                                f"{create}; or, on EKS, kubectl -n {ns} annotate serviceaccount {account} "
                                f"{IRSA_ANNOTATION}=arn:aws:iam::ACCOUNT:role/ROLE"))
        elif secret is None:
            checks.append(Check("s3 secret", WARN, f"Secret {S3_SECRET} is absent: optional, the store {store!r} is "
                                                   "not S3"))
        elif missing:
            checks.append(Check("s3 secret", FAIL, f"Secret {S3_SECRET} lacks the key(s) {', '.join(missing)}",
                                f"kubectl -n {ns} delete secret {S3_SECRET}; {create}"))
        else:
            checks.append(Check("s3 secret", OK, f"Secret {S3_SECRET} holds {', '.join(sorted(S3_SECRET_ENV))}"))
    except ApiException as exc:
        checks.append(_unreadable("s3 secret", f"Secret {S3_SECRET}", exc))
    try:
        config_map = _read(kube.core.read_namespaced_config_map, SETTINGS_CONFIG_MAP, ns)
        if config_map is None:
            checks.append(Check("settings", WARN, f"ConfigMap {SETTINGS_CONFIG_MAP} is absent (optional): the pods "
                                                  "get no AWS_ENDPOINT_URL or MLFLOW_TRACKING_URI from it, so S3 is "
                                                  "AWS's unless s3_endpoint is given, and lineage goes nowhere "
                                                  "unless mlflow_tracking_uri is"))
        else:
            settings = {k: str(v) for k, v in (config_map.get("data") or {}).items()}
            checks.append(Check("settings", OK, f"ConfigMap {SETTINGS_CONFIG_MAP}: " + ", ".join(
                f"{key}={settings.get(key, '(unset)')}" for key in ("AWS_ENDPOINT_URL", "MLFLOW_TRACKING_URI"))))
    except ApiException as exc:
        checks.append(_unreadable("settings", f"ConfigMap {SETTINGS_CONFIG_MAP}", exc))
    pull = str(parameters.get("image_pull_secret", job_spec.DEFAULT_PULL_SECRET))
    create_pull = (f"kubectl -n {ns} create secret docker-registry {pull} --docker-server=<registry> "
                   "--docker-username=<user> --docker-password=<token>")
    try:
        secret = _read(kube.core.read_namespaced_secret, pull, ns)
        if secret is None:
            checks.append(Check("pull secret", WARN, f"Secret {pull} is absent (optional): the kubelet pulls without "
                                                     "it, so only public images pull (a private registry's fail the "
                                                     "job within the image-pull grace)"))
        elif secret.get("type") != "kubernetes.io/dockerconfigjson" or \
                ".dockerconfigjson" not in (secret.get("data") or {}):
            checks.append(Check("pull secret", FAIL, f"Secret {pull} is of type {secret.get('type')!r}: the kubelet "
                                                     "reads only a kubernetes.io/dockerconfigjson Secret's "
                                                     ".dockerconfigjson", f"kubectl -n {ns} delete secret {pull}; "
                                                     f"{create_pull}"))
        else:
            checks.append(Check("pull secret", OK, f"Secret {pull} (kubernetes.io/dockerconfigjson)"))
    except ApiException as exc:
        checks.append(_unreadable("pull secret", f"Secret {pull}", exc))
    return checks, settings


def check_runtime(kube, used: dict[str, list[str]], scheduler_kind: str) -> Check:
    from kubernetes.client.exceptions import ApiException

    if TRAINJOB.name not in used:
        return Check("trainer runtime", SKIPPED, "no stage runs as a TrainJob")
    reference = TRAINJOB.load_template()["spec"]["runtimeRef"]
    kind, name = reference.get("kind", "ClusterTrainingRuntime"), job_spec.TRAINJOB_RUNTIMES[scheduler_kind]
    group, version = "trainer.kubeflow.org", "v1alpha1"
    try:
        if kind == "ClusterTrainingRuntime":
            found = _read(kube.custom.get_cluster_custom_object, group, version, RUNTIME_PLURALS[kind], name)
        else:
            found = _read(kube.custom.get_namespaced_custom_object, group, version, kube.namespace,
                          RUNTIME_PLURALS[kind], name)
    except ApiException as exc:
        return _unreadable("trainer runtime", f"{kind} {name}", exc)
    if found is None:
        return Check("trainer runtime", FAIL, f"{kind} {name} does not exist: every TrainJob of the run names it",
                     "kubectl apply --server-side -f manifests/cluster/trainer-runtimes.yaml (as cluster-admin)")
    return Check("trainer runtime", OK, f"{kind} {name}")


def check_kueue(kube, used: dict[str, list[str]], scheduler: str) -> list[Check]:
    from kubernetes.client.exceptions import ApiException

    kind, queue = job_spec.parse_scheduler(scheduler)
    if kind != "kueue":
        return [Check("kueue", SKIPPED, f"scheduler={scheduler!r} is not kueue:<queue>")]
    checks = []
    local_queue = ('{"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "' + queue +
                   '"}, "spec": {"clusterQueue": "<cluster queue>"}}')
    try:
        found = _read(kube.custom.get_namespaced_custom_object, "kueue.x-k8s.io", "v1beta1", kube.namespace,
                      "localqueues", queue)
        checks.append(Check("kueue queue", OK, f"LocalQueue {queue}") if found is not None else
                      Check("kueue queue", FAIL, f"LocalQueue {queue} does not exist in namespace {kube.namespace!r} "
                                                 "(or Kueue is not installed): the jobs would never be admitted",
                            f"echo '{local_queue}' | kubectl -n {kube.namespace} apply -f -"))
    except ApiException as exc:
        checks.append(_unreadable("kueue queue", f"LocalQueue {queue}", exc))
    try:
        config_map = _read(kube.core.read_namespaced_config_map, KUEUE_CONFIG_MAP, KUEUE_NAMESPACE)
    except ApiException as exc:
        config_map, why = None, f"{exc.status} {exc.reason}"
    else:
        why = "it does not exist"
    if config_map is None:
        checks.append(Check("kueue jobs", SKIPPED, f"cannot read ConfigMap {KUEUE_NAMESPACE}/{KUEUE_CONFIG_MAP} "
                                                   f"({why}): Kueue's integrations unknown; a PyTorchJob's "
                                                   f"':{job_spec.KUEUE_PYTORCHJOB_STATEMENT}' is taken at its word"))
        return checks
    configuration = yaml.safe_load((config_map.get("data") or {}).get(KUEUE_CONFIG_KEY) or "") or {}
    frameworks = list(((configuration.get("integrations") or {}).get("frameworks") or KUEUE_DEFAULT_FRAMEWORKS))
    off = [JOB_KINDS[k].kueue_framework for k in used if JOB_KINDS[k].kueue_framework not in frameworks]
    if off:
        checks.append(Check("kueue jobs", FAIL, f"Kueue's integrations.frameworks lacks {', '.join(off)}: Kueue "
                                                "ignores the queue label of those jobs, which run at once, unqueued",
                            f"kubectl -n {KUEUE_NAMESPACE} edit configmap {KUEUE_CONFIG_MAP} (add them to "
                            f"integrations.frameworks), then kubectl -n {KUEUE_NAMESPACE} rollout restart deployment "
                            "kueue-controller-manager"))
    elif used:
        checks.append(Check("kueue jobs", OK, f"Kueue integrates {', '.join(JOB_KINDS[k].kueue_framework for k in used)}"))
    else:
        checks.append(Check("kueue jobs", SKIPPED, "no stage runs as a job"))
    return checks


def cluster_checks(kube, request: DoctorRequest) -> tuple[list[Check], dict[str, str]]:
    """The checks of the module docstring, and the settings ConfigMap's data (for the S3 and MLflow checks)."""
    parameters = request.parameters
    used = job_kinds_used(parameters)
    scheduler = str(parameters.get("scheduler", ""))
    checks = check_crds(kube, used) + [check_rbac(kube, request.service_account)]
    object_checks, settings = _object_checks(kube, parameters, request.service_account)
    checks += object_checks
    checks.append(check_runtime(kube, used, job_spec.parse_scheduler(scheduler)[0]))
    checks += check_kueue(kube, used, scheduler)
    return checks, settings
