"""Following a multi-day training through what a cluster does to a launcher, against the emulated API server
(:mod:`tests.cluster.apiserver_emulator`): the API failing for a while (429 with Retry-After, 503, reset
connections, a lost create answer, an outage longer than the launcher's limit), a long wait in the queue (its own
limit; the training deadline counts from when the pods run), watches and followed logs instead of polling, events
read by server-side field selectors, and the launcher's Role enforced on every call (a grant less fails with the
Role named)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import pytest

from fourm_kfp.cluster.job_kinds import JOB_KINDS, PYTORCHJOB, JobFailed
from fourm_kfp.cluster.job_launcher import run_job
from fourm_kfp.cluster.kube import api_retries
from fourm_kfp.errors import UserError
from tests.cluster.apiserver_emulator import launcher_role
from tests.cluster.job_scripts import FAST, Operator, job as _job, pod_labels, run_pods, wait
from tests.cluster.kube_emulator import EmulatedCluster, running_status

#: The transient failures an API server (or the load balancer in front of it) answers with, for a while.
BLIPS = {"429-retry-after": dict(status=429, retry_after=1), "503": dict(status=503),
         "connection-reset": dict(reset="before")}
#: Retries that give up at once, so that an error reaches the launcher's own loop.
NO_RETRIES = api_retries(attempts=0)


@pytest.fixture
def cluster():
    emulated = EmulatedCluster()
    yield emulated
    emulated.close()


def _steps(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("step ")]


def _training(cluster, name: str, lines: list[str], middle) -> None:
    """The operator's script: the pods run, the master logs 20 steps with ``middle()`` after the 10th, succeeds."""
    cluster.wait_for_job(PYTORCHJOB.resource, name)
    master = run_pods(cluster, name)[0]
    cluster.kubelet.write(master, "pytorch", *[f"step {i}/20" for i in range(10)])
    wait(lambda: "step 9/20" in lines)
    middle()
    cluster.kubelet.write(master, "pytorch", *[f"step {i}/20" for i in range(10, 20)])
    wait(lambda: "step 19/20" in lines)
    cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "PyTorchJobSucceeded", "done"))


# ------------------------------------------------------------------------------------ API errors (point 1)


@pytest.mark.parametrize("blip", sorted(BLIPS))
def test_a_blip_of_the_api_in_the_middle_of_a_follow_does_not_end_the_training(cluster, blip):
    """The streams drop (the API server restarts) and the next five requests fail, more than urllib3's default
    three retries: the client retries them (honouring Retry-After), the launcher reconnects, and the job is followed
    to its end with each log line once."""
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []
    faults = []

    def middle():
        faults.append(cluster.fail(5, **BLIPS[blip]))
        cluster.drop_streams()
        wait(lambda: faults[0].count == 0)

    script = Operator(lambda: _training(cluster, name, lines, middle))
    started = time.monotonic()
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append)
    script.finish()
    assert result.succeeded and faults[0].count == 0
    assert _steps(lines) == [f"step {i}/20" for i in range(20)]
    if blip.startswith("429"):
        assert time.monotonic() - started >= 1  # Retry-After: 1 honoured
    assert lines[-1] == f"[launcher] deleted PyTorchJob {name}"


def test_a_create_whose_answer_was_lost_is_retried_and_its_job_adopted(cluster):
    """The connection drops after the API server created the job: the client sends the POST again, gets 409, and
    the launcher adopts the job it made instead of failing on a name conflict."""
    job = _job()
    name = job["metadata"]["name"]
    fault = cluster.fail(1, reset="after", method="POST")
    script = Operator(lambda: (cluster.wait_for_job(PYTORCHJOB.resource, name),
                               cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))))
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lambda line: None)
    script.finish()
    assert fault.count == 0 and result.succeeded and result.adopted


def test_errors_the_client_does_not_cure_are_said_and_following_goes_on(cluster):
    """Errors that outlast the client's retries (here none) reach the launcher's loop: it says so in the step's
    log, reads again, says when the API answers again, and follows the job to its end."""
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []

    def middle():
        cluster.fail(6, status=503)
        cluster.drop_streams()
        wait(lambda: any("the Kubernetes API does not answer" in line for line in lines))

    script = Operator(lambda: _training(cluster, name, lines, middle))
    result = run_job(cluster.api(retries=NO_RETRIES), PYTORCHJOB, job, deadline_s=60, settings=FAST,
                     out=lines.append)
    script.finish()
    assert result.succeeded and _steps(lines) == [f"step {i}/20" for i in range(20)]
    down = [i for i, line in enumerate(lines) if "the Kubernetes API does not answer" in line]
    up = [i for i, line in enumerate(lines) if "the Kubernetes API answers again" in line]
    assert down and up and down[0] < up[-1], lines
    assert "503" in lines[down[0]] and "api_outage_s" in lines[down[0]]


def test_an_api_outage_longer_than_the_limit_fails_clearly_and_leaves_the_job(cluster, caplog):
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        run_pods(cluster, name)
        wait(lambda: any("all 2 pods run" in line for line in lines))
        cluster.outage()

    script = Operator(operator)
    settings = replace(FAST, api_outage_s=1.0)
    with caplog.at_level(logging.WARNING), pytest.raises(JobFailed) as failure:
        run_job(cluster.api(retries=NO_RETRIES), PYTORCHJOB, job, deadline_s=60, settings=settings,
                out=lines.append)
    script.finish()
    message = str(failure.value)
    assert "the Kubernetes API has not answered the launcher for" in message and "api_outage_s=1s" in message
    assert "a retry of this step adopts it" in message
    assert any("Kubernetes API failed" in record.getMessage() for record in caplog.records)  # each error logged
    cluster.outage(False)
    assert cluster.admin().get(PYTORCHJOB.resource, name) is not None  # left running for the step's retry
    assert any(f"left PyTorchJob {name} in place" in line for line in lines)


# --------------------------------------------------------------------------- the queue's clock (point 2)

#: Volcano's Warning on the PodGroup while the gang does not fit (see test_job_launcher.QUEUES).
UNSCHEDULABLE = "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"


def _queued(cluster, name: str, seconds: float) -> None:
    """The job waits ``seconds`` in Volcano's queue: no pods, a Warning on its PodGroup every scheduling cycle."""
    cluster.wait_for_job(PYTORCHJOB.resource, name)
    event = cluster.add_event("PodGroup", name, "Unschedulable", UNSCHEDULABLE, component="volcano")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.1)
        cluster.repeat_event(event)


def test_a_job_queued_longer_than_its_deadline_runs_and_succeeds(cluster):
    """A day in the queue must not eat the training's time: the deadline counts from when all the pods run."""
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []

    def operator():
        _queued(cluster, name, 2.0)  # twice the deadline
        master = run_pods(cluster, name)[0]
        cluster.kubelet.write(master, "pytorch", "step 1/1")
        time.sleep(0.5)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=1, settings=replace(FAST, queue_s=30),
                     out=lines.append)
    script.finish()
    assert result.succeeded
    assert any("queued: Unschedulable (PodGroup" in line for line in lines)
    assert any("all 2 pods run after" in line and "deadline of 1s counts from now" in line for line in lines)


def test_a_job_queued_longer_than_queue_s_fails_and_is_deleted(cluster):
    job = _job()
    name = job["metadata"]["name"]
    script = Operator(lambda: _queued(cluster, name, 1.5))
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=3600, settings=replace(FAST, queue_s=0.5),
                out=lambda line: None)
    script.finish()
    message = str(failure.value)
    assert time.monotonic() - started < 3  # not the deadline
    assert "waited in the queue longer than queue_s=0.5s" in message
    assert "0 of 2 pods running" in message and UNSCHEDULABLE in message and "queue_timeout_s" in message
    assert cluster.api().get(PYTORCHJOB.resource, name) is None  # given up on: deleted


def test_the_deadline_counts_from_when_all_pods_run(cluster):
    """Pending pods (unschedulable) count as queued; the deadline starts once both run, not at the launch."""
    job = _job()
    name = job["metadata"]["name"]
    ran_at = []

    def operator():
        cluster.wait_for_job(PYTORCHJOB.resource, name)
        master, worker = f"{name}-master-0", f"{name}-worker-0"
        cluster.add_pod(master, pod_labels(name, "master", 0), "pytorch", conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}])
        time.sleep(1.5)  # one pod pending, the other not even created
        cluster.set_pod_status(master, running_status("pytorch"))
        cluster.add_pod(worker, pod_labels(name, "worker", 0), "pytorch")
        cluster.set_pod_status(worker, running_status("pytorch"))
        ran_at.append(time.monotonic())

    script = Operator(operator)
    with pytest.raises(JobFailed, match="did not finish within its deadline of 1s .* after its pods started"):
        run_job(cluster.api(), PYTORCHJOB, job, deadline_s=1, settings=replace(FAST, queue_s=30),
                out=lambda line: None)
    failed_at = time.monotonic()
    script.finish()
    assert failed_at - ran_at[0] >= 1.0  # a full deadline after the pods ran


def test_the_job_backend_takes_its_queue_limit_from_the_run_s_cluster_parameters(monkeypatch, tmp_path):
    """KubernetesJob follows with the run-wide queue_timeout_s (and the stage's delete_job)."""
    from fourm_kfp.cluster.job_spec import ClusterParams, JobParams
    from fourm_kfp.launchers import kubernetes_job
    from fourm_kfp.launchers.stage import RunContext, plan_launch

    seen = {}

    def fake_run_job(api, kind, job, deadline_s, settings, **kwargs):
        seen["settings"] = settings
        raise JobFailed("stop here")

    monkeypatch.setattr(kubernetes_job, "run_job", fake_run_job)
    run = RunContext("smoke", store_uri=str(tmp_path / "store"), tracking_uri="none")
    backend = kubernetes_job.KubernetesJob(run, JobParams(accelerator="cpu", delete_job=False), "fourm",
                                           api=object(), owner=kubernetes_job.Owner("v1", "Workflow", "w", "u"),
                                           cluster=ClusterParams(queue_timeout_s=7200), out=lambda line: None)
    with pytest.raises(JobFailed, match="stop here"):
        backend.start(plan_launch("pretrain", run), ["stage", "pretrain"], lambda: None)
    assert seen["settings"].queue_s == 7200 and seen["settings"].delete is False


# ------------------------------------------------------------------ watches, server-side selectors (point 4)


@pytest.mark.parametrize("resource, selector, ok", [
    ("events", "involvedObject.uid=u,type=Warning", True), ("events", "reportingComponent=kueue,source=kubelet", True),
    ("events", "involvedObject.labels=x", False), ("events", "message=x", False),
    ("pods", "status.phase=Running,spec.nodeName=n", True), ("pods", "status.reason=x", False),
    ("pytorchjobs", "metadata.name=x", True), ("pytorchjobs", "status.conditions=x", False)])
def test_the_emulated_api_server_takes_only_the_field_labels_the_real_one_supports(cluster, resource, selector, ok):
    from kubernetes.client.exceptions import ApiException

    api = cluster.api()
    if resource == "pytorchjobs":
        call = lambda: api.custom.list_namespaced_custom_object("kubeflow.org", "v1", "fourm", resource,  # noqa: E731
                                                                field_selector=selector)
    else:
        call = lambda: getattr(api.core, f"list_namespaced_{resource[:-1]}")("fourm",  # noqa: E731
                                                                             field_selector=selector)
    if ok:
        call()
        return
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 400 and "field label not supported: " in refused.value.body


def test_the_launcher_watches_follows_the_log_and_reads_events_by_server_side_selectors(cluster):
    """Waiting in the queue and then running for a while, the launcher lists and watches the job and its pods once
    each, follows the master's log as one stream, and reads events only by involvedObject (never the namespace's)."""
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []

    def operator():
        _queued(cluster, name, 0.5)
        master = run_pods(cluster, name)[0]
        for i in range(20):  # a while of training: 40 of the launcher's poll_s
            cluster.kubelet.write(master, "pytorch", f"step {i}/20")
            time.sleep(0.1)
        wait(lambda: "step 19/20" in lines)
        cluster.set_job_conditions(PYTORCHJOB.resource, name, ("Succeeded", "", ""))

    script = Operator(operator)
    assert run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=FAST, out=lines.append).succeeded
    script.finish()
    calls = cluster.requests()
    count = {}
    for info, params in calls:
        key = (info.verb, info.resource)
        count[key] = count.get(key, 0) + 1
    assert count[("watch", "pytorchjobs")] >= 1 and count[("watch", "pods")] >= 1
    assert count[("list", "pytorchjobs")] == 1 and count[("list", "pods")] == 1  # no relisting, no polling
    assert count.get(("get", "pytorchjobs"), 0) == 1  # the create-or-adopt check
    logs = [params.get("follow") == "True" for info, params in calls if info.resource == "pods/log"]
    assert 1 <= logs.count(True) <= 2 and logs.count(False) <= 1  # one stream; one last read at the job's end
    events = [params.get("fieldSelector", "") for info, params in calls if info.resource == "events"]
    assert events and all("type=Warning" in selector and selector.startswith("involvedObject.")
                          for selector in events), events
    assert _steps(lines) == [f"step {i}/20" for i in range(20)]


def test_a_watch_resumed_after_its_history_expired_lists_again(cluster):
    """The server ends each watch after watch_s and the launcher resumes from the last resourceVersion; once the
    server's history no longer holds it (410 Expired), the launcher lists again and still sees the job end."""
    job = _job()
    name = job["metadata"]["name"]
    lines: list[str] = []

    def middle():
        cluster.compact()
        time.sleep(1.5)  # past a watch's end
        wait(lambda: cluster.emulator.expired >= 1)

    script = Operator(lambda: _training(cluster, name, lines, middle))
    result = run_job(cluster.api(), PYTORCHJOB, job, deadline_s=60, settings=replace(FAST, watch_s=1),
                     out=lines.append)
    script.finish()
    assert result.succeeded and _steps(lines) == [f"step {i}/20" for i in range(20)]


# ------------------------------------------------------------------------------------ the Role (point 5)

_, ROLE = launcher_role()
GRANTS = sorted((group, resource, verb) for rule in ROLE for group in rule["apiGroups"]
                for resource in rule["resources"] for verb in rule["verbs"])


def _without(grant: tuple[str, str, str]) -> list[dict]:
    group, resource, verb = grant
    rules = []
    for rule in ROLE:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                verbs = [v for v in rule["verbs"] if (g, r, v) != grant]
                if verbs:
                    rules.append({"apiGroups": [g], "resources": [r], "verbs": verbs})
    return rules


@pytest.mark.parametrize("grant", GRANTS, ids=["/".join(filter(None, grant)) for grant in GRANTS])
def test_every_grant_of_the_role_is_used_and_a_missing_one_fails_naming_the_role(grant, tmp_path, monkeypatch):
    """The launcher's whole life (its own pod read, a wait for pods with events, the log, success, the exit
    handler's clean-up) against the Role less one grant: that call is refused with 403, and the step's error (or,
    for events, its log) names the Role to bind."""
    from fourm_kfp.cluster.job_spec import JobParams
    from fourm_kfp.cluster.stop_jobs import delete_run_jobs
    from fourm_kfp.launchers.kubernetes_job import KubernetesJob
    from fourm_kfp.launchers.stage import RunContext, plan_launch

    launcher = "trainjob" if grant[1] == "trainjobs" else "pytorchjob"
    kind = JOB_KINDS[launcher]
    cluster = EmulatedCluster(rules=_without(grant))
    try:
        monkeypatch.setenv("FOURM_POD_NAME", "launcher")
        cluster.add_pod("launcher", {}, "main", phase="Running")
        run = RunContext("smoke", store_uri=str(tmp_path / "store"), tracking_uri="none")
        plan = plan_launch("pretrain", run)
        name = f"fourm-pretrain-{plan.address}"

        launcher_ended = threading.Event()

        def operator():
            if cluster.wait_for_job(kind.resource, name, until=launcher_ended) is None:
                return  # refused before the job was created: nothing to operate
            time.sleep(0.3)  # no pods yet: events are read
            master = f"{name}-master-0"
            cluster.add_pod(master, {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type":
                                     "master", "jobset.sigs.k8s.io/jobset-name": name,
                                     "jobset.sigs.k8s.io/job-index": "0"}, kind.container)
            cluster.set_pod_status(master, running_status(kind.container))
            cluster.kubelet.write(master, kind.container, "step 1/1")
            time.sleep(0.3)
            cluster.set_job_conditions(kind.resource, name, ("Succeeded", "", ""), ("Complete", "", ""))

        script = Operator(operator)
        backend = KubernetesJob(run, JobParams(launcher=launcher, accelerator="cpu", nodes=1), "fourm",
                                kfp_run_id="run-1", api=cluster.api(), settings=FAST, out=lambda line: None)
        warnings: list[logging.LogRecord] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = warnings.append  # on the package's logger: the step's setup_logging resets the root's
        logging.getLogger("fourm_kfp").addHandler(handler)
        try:
            backend.start(plan, ["stage", "pretrain"], lambda: None)
            delete_run_jobs(cluster.api(), "run-1", out=lambda line: None)
            error = None
        except UserError as exc:
            error = str(exc)
        finally:
            logging.getLogger("fourm_kfp").removeHandler(handler)
            launcher_ended.set()
        script.join(5)
        said = error or " ".join(record.getMessage() for record in warnings)
        refused = [(info.group, info.resource, info.verb) for info, _ in cluster.requests()
                   if (info.group, info.resource, info.verb) == grant]
        assert refused, f"the launcher never needed {grant}: remove it from manifests/base/rbac.yaml"
        assert "Role fourm-pipeline-runner" in said and grant[2] in said and "forbidden" in said, said
    finally:
        cluster.close()
