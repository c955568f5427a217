"""Fill a job template in with a :class:`~fourm_kfp.cluster.job_spec.JobRequest`: one renderer per job kind
(:func:`render_pytorchjob`, :func:`render_trainjob`; the kinds' records in :mod:`.job_kinds` pair each with its
template) and the pieces they share (the pods' resources, placement, labels, network settings and torchrun's
arguments). What they fill in is listed in :mod:`.job_spec`'s docstring; nothing here repeats the templates' pod spec.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from fourm_kfp.cluster.job_spec import (ADDRESS_LABEL, KEEP_LABEL, KUEUE_QUEUE_LABEL, RDMA_CAPABILITY, RESTARTS,
                                        RUN_ID_LABEL, STAGE_LABEL, TRAINJOB_RUNTIMES, VOLCANO_QUEUE_ANNOTATION,
                                        JobRequest, backoff_limit, parse_rdma_resource, parse_scheduler)


def rendezvous_args(req: JobRequest) -> list[str]:
    """torchrun's options that make a started node wait ``cluster.rendezvous_timeout_s`` for the others.

    A fixed-size job meets at the static rendezvous (``PET_MASTER_ADDR``/``PORT``): the Master's TCPStore waits that
    long for every node to connect and the others keep trying to reach it that long (rendezvous option ``timeout``,
    torchrun's default 900 s). An elastic job meets at the c10d rendezvous: ``join_timeout`` (default 600 s) bounds
    the wait for ``min_nodes``."""
    key = "join_timeout" if req.min_nodes else "timeout"
    return [f"--rdzv-conf={key}={req.cluster.rendezvous_timeout_s}"]


def _pod_resources(template: dict[str, Any], req: JobRequest) -> dict[str, Any]:
    """The template's per-node resources with the request's CPU, memory and accelerator count."""
    resources_ = copy.deepcopy(template)
    requests, limits = resources_.setdefault("requests", {}), resources_.setdefault("limits", {})
    for section in (requests, limits):
        for key in [k for k in section if k.endswith("/gpu")]:
            del section[key]
    if req.gpus_per_node:
        requests[req.accelerator] = limits[req.accelerator] = req.gpus_per_node
    if req.cpu_per_node:
        requests["cpu"] = req.cpu_per_node
    if req.memory_per_node:
        requests["memory"] = limits["memory"] = req.memory_per_node
    rdma = parse_rdma_resource(req.cluster.rdma_resource)
    if rdma:
        requests[rdma[0]] = limits[rdma[0]] = rdma[1]
    return resources_


def _network_env(env: list[dict[str, Any]], req: JobRequest) -> list[dict[str, Any]]:
    """The container's env with the run's ``nccl_env`` added (a variable the template sets is replaced)."""
    names = set(req.cluster.nccl_env)
    return [e for e in env if e.get("name") not in names] + [
        {"name": name, "value": value} for name, value in sorted(req.cluster.nccl_env.items())]


def _rdma_capability(container: dict[str, Any], req: JobRequest) -> None:
    """``IPC_LOCK`` added to the container's capabilities when the job requests an RDMA device."""
    if parse_rdma_resource(req.cluster.rdma_resource):
        capabilities = container.setdefault("securityContext", {}).setdefault("capabilities", {})
        capabilities["add"] = sorted({*capabilities.get("add", []), RDMA_CAPABILITY})


def _tolerations(template: list[dict[str, Any]], req: JobRequest) -> list[dict[str, Any]]:
    """The template's accelerator toleration (retargeted to the accelerator, dropped on CPU nodes), the run's GPU
    tolerations on accelerator nodes (less those whose key the stage's own tolerate: the stage's win), the stage's."""
    kept = []
    for toleration in template:
        if str(toleration.get("key", "")).endswith("/gpu"):
            if not req.gpus_per_node:
                continue
            toleration = {**toleration, "key": req.accelerator}
        kept.append(toleration)
    stage_keys = {t.get("key") for t in req.tolerations}
    run_wide = [t for t in req.cluster.gpu_tolerations if t.get("key") not in stage_keys] if req.gpus_per_node else []
    for toleration in [*run_wide, *req.tolerations]:
        if toleration not in kept:
            kept.append(toleration)
    return kept


def _place_pod(pod_spec: dict[str, Any], req: JobRequest) -> None:
    """Where the job's pods may run and what they pull with: tolerations, node selector (the run's GPU selector on
    accelerator nodes, the stage's winning on a key clash) and the image pull secret."""
    pod_spec["tolerations"] = _tolerations(pod_spec.get("tolerations", []), req)
    if not pod_spec["tolerations"]:
        del pod_spec["tolerations"]
    selector = {**(req.cluster.gpu_node_selector if req.gpus_per_node else {}), **req.node_selector}
    if selector:
        pod_spec["nodeSelector"] = selector
    if req.cluster.image_pull_secret:
        pod_spec["imagePullSecrets"] = [{"name": req.cluster.image_pull_secret}]


def _metadata(obj: dict[str, Any], req: JobRequest) -> None:
    meta = obj["metadata"]
    meta["name"] = req.name
    labels = meta.setdefault("labels", {})
    labels.update(_labels(req))
    if not req.delete_job:
        labels[KEEP_LABEL] = "true"
    kind, queue = parse_scheduler(req.cluster.scheduler)
    if kind == "kueue":
        labels[KUEUE_QUEUE_LABEL] = queue
    if req.owner is not None and req.delete_job:  # a kept job must outlive the Workflow, which KFP deletes in a day
        meta["ownerReferences"] = [{"apiVersion": req.owner.api_version, "kind": req.owner.kind,
                                    "name": req.owner.name, "uid": req.owner.uid, "controller": False,
                                    "blockOwnerDeletion": False}]


def _labels(req: JobRequest) -> dict[str, str]:
    return {STAGE_LABEL: req.stage, ADDRESS_LABEL: req.address, RUN_ID_LABEL: req.kfp_run_id}


def _pod_labels(pod_metadata: dict[str, Any], req: JobRequest) -> None:
    pod_metadata.setdefault("labels", {}).update(_labels(req))


def render_pytorchjob(req: JobRequest, job: dict[str, Any]) -> dict[str, Any]:
    """The PyTorchJob of ``req`` (Training Operator ``kubeflow.org/v1``), filled into ``job``, its template."""
    _metadata(job, req)
    spec = job["spec"]
    spec["nprocPerNode"] = str(req.procs_per_node)
    spec["runPolicy"]["activeDeadlineSeconds"] = job_deadline_s(req)
    spec["runPolicy"]["backoffLimit"] = backoff_limit(req.nodes)
    if not req.delete_job:  # kept: no TTL deletes it either (the launcher deletes the jobs it does not keep)
        spec["runPolicy"].pop("ttlSecondsAfterFinished", None)
    pod = copy.deepcopy(spec["pytorchReplicaSpecs"]["Master"]["template"])
    _pod_labels(pod["metadata"], req)
    pod_spec = pod["spec"]
    [container] = pod_spec["containers"]
    container["image"] = req.image
    container["args"] = _torchrun_args(req)
    container["resources"] = _pod_resources(container["resources"], req)
    container["env"] = _network_env(container.get("env", []), req)
    _rdma_capability(container, req)
    _place_pod(pod_spec, req)
    replicas = {"Master": {**spec["pytorchReplicaSpecs"]["Master"], "template": pod}}
    if req.nodes > 1:
        worker = spec["pytorchReplicaSpecs"].get("Worker") or spec["pytorchReplicaSpecs"]["Master"]
        replicas["Worker"] = {**worker, "replicas": req.nodes - 1, "template": copy.deepcopy(pod)}
    spec["pytorchReplicaSpecs"] = replicas
    if req.min_nodes:
        # torchrun's --max-restarts counts per node (each agent restarts its own workers once per crash): no scaling.
        # The rendezvous store lives on the Master (the operator's default is worker-0, a second pod whose loss would
        # end the job): the pod the Workers' init containers wait for, reached through its per-pod Service.
        spec["elasticPolicy"] = {"minReplicas": req.min_nodes, "maxReplicas": req.nodes, "rdzvBackend": "c10d",
                                 "rdzvHost": f"{req.name}-master-0", "maxRestarts": RESTARTS}
    kind, queue = parse_scheduler(req.cluster.scheduler)
    if kind == "volcano":
        # The operator (started with --gang-scheduler-name=volcano) makes a Volcano PodGroup of this, sets the pods'
        # schedulerName and creates the pods once the group is admitted; minAvailable defaults to all replicas, the
        # queue to "default". An elastic job starts with min_nodes.
        policy: dict[str, Any] = {"minAvailable": req.min_nodes or req.nodes}
        if queue:
            policy["queue"] = queue
        spec["runPolicy"]["schedulingPolicy"] = policy
    return job


def render_trainjob(req: JobRequest, job: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob of ``req`` (Trainer v2 ``trainer.kubeflow.org/v1alpha1``), filled into ``job``, its template, on
    the runtime of its scheduler (:data:`TRAINJOB_RUNTIMES`)."""
    _metadata(job, req)
    spec = job["spec"]
    kind, queue = parse_scheduler(req.cluster.scheduler)
    spec["runtimeRef"]["name"] = TRAINJOB_RUNTIMES[kind]
    spec["activeDeadlineSeconds"] = job_deadline_s(req)
    trainer = spec["trainer"]
    trainer.update(image=req.image, numNodes=req.nodes, numProcPerNode=req.procs_per_node, args=_torchrun_args(req))
    trainer["resourcesPerNode"] = _pod_resources(trainer["resourcesPerNode"], req)
    trainer["env"] = _network_env(trainer.get("env", []), req)
    [patch] = spec["runtimePatches"]
    if kind == "volcano" and queue:
        # the JobSet's metadata, where Trainer's Volcano plugin reads the PodGroup's queue
        jobset_meta = patch["trainingRuntimeSpec"]["template"].setdefault("metadata", {})
        jobset_meta.setdefault("annotations", {})[VOLCANO_QUEUE_ANNOTATION] = queue
    [node_job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node_job["template"]["spec"]["template"]
    _pod_labels(pod["metadata"], req)
    _place_pod(pod["spec"], req)
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    _rdma_capability(container, req)
    return job


def job_deadline_s(req: JobRequest) -> int:
    """The job's own ``activeDeadlineSeconds``: the training deadline plus the queue limit. The operators count it
    from the job's start, which a queue (a Volcano PodGroup, Kueue's suspension) may precede by up to
    ``queue_timeout_s``; the launcher enforces each limit apart (queue time, then the deadline from the moment the pods
    run), so this is the backstop for a job whose launcher is gone."""
    return req.deadline_s + req.cluster.queue_timeout_s


def _torchrun_args(req: JobRequest) -> list[str]:
    """The container's arguments after ``torchrun``, the same on every node and for both job kinds."""
    return [*rendezvous_args(req), "--no-python", "fourm-kfp", *req.stage_args]


def to_yaml(job: dict[str, Any]) -> str:
    return yaml.safe_dump(job, sort_keys=False, default_flow_style=False)
