"""Lineage in MLflow: one parent run per pipeline run, one child run per stage.

The parent run id travels between stages as a plain string (a KFP parameter), so a stage running in another pod
attaches its child run to the same parent. A child run holds the stage's resolved config as params, every input
and output as an MLflow dataset (URI + manifest digest), metrics, and the stage's report artifacts. A stage whose
output was reused is still recorded, tagged ``fourm.reused`` and pointing at the run that produced the output.

Every run carries MLflow's standard context tags (:func:`context_tags`: ``mlflow.user``, ``mlflow.source.name``,
``mlflow.source.type``, ``mlflow.source.git.commit`` when known) and, under a KFP run, the KFP run's id and page.

Tracking URI: ``MLFLOW_TRACKING_URI`` (a server in the cluster), else the embedded default, a SQLite store at
``<root>/mlflow.db`` with artifacts beside it. Everything goes through :class:`Tracker`, whose :class:`NullTracker`
twin lets stages run with lineage switched off.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from fourm_kfp.storage import PACKAGE_SCHEME, package_folder

log = logging.getLogger(__name__)

EXPERIMENT = os.environ.get("FOURM_MLFLOW_EXPERIMENT", "fourm-kfp")
MAX_PARAM_LENGTH = 6000
TAG_STAGE, TAG_STATUS, TAG_REUSED, TAG_PRODUCED_BY = "fourm.stage", "fourm.status", "fourm.reused", "fourm.produced_by"
TAG_KIND, TAG_OUTPUT_URI, TAG_ADDRESS = "fourm.kind", "fourm.output_uri", "fourm.content_hash"
#: The KFP run a pipeline (parent) run belongs to (set by the pipeline's first step), the KFP host a ``submit``
#: opened it against, and the KFP UI page of the run (on stage runs, when the host is known).
TAG_KFP_RUN_ID, TAG_KFP_HOST, TAG_KFP_RUN_URL = "fourm.kfp_run_id", "fourm.kfp_host", "fourm.kfp_run_url"


def default_tracking_uri(root: str | os.PathLike) -> str:
    """The embedded default store for a local run folder: ``sqlite:///<root>/mlflow.db``."""
    return f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def resolve_tracking_uri(explicit: str | None, root: str | os.PathLike | None) -> str | None:
    """Explicit URI > ``MLFLOW_TRACKING_URI`` > SQLite in ``root``; ``"none"`` switches lineage off."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or (default_tracking_uri(root) if root else None)
    return None if uri in (None, "", "none") else uri


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` → ``{"a.b": "1"}``, values cut to MLflow's length limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            text = str(value)
            flat[name] = text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 3] + "..."
    return flat


class Tracker:
    """Where a run's lineage goes. This base class is the no-op sink."""

    run_id: str | None = None
    tracking_uri: str | None = None  # where the run lives (the model registry is there too)
    parent_run_id: str | None = None  # the pipeline run

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...
    def log_dataset(self, name: str, uri: str, digest: str, context: str) -> None: ...
    def log_artifact(self, name: str, data: bytes) -> None: ...


NullTracker = Tracker


class MLflowTracker(Tracker):
    """A tracker writing to one MLflow run through ``MlflowClient`` (no global active-run state)."""

    def __init__(self, client, run_id: str, tracking_uri: str | None = None, parent_run_id: str | None = None):
        self.client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_dataset(self, name: str, uri: str, digest: str, context: str) -> None:
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        if uri.startswith(PACKAGE_SCHEME):  # no MLflow source knows pkg://: the folder it names on this machine
            uri = package_folder(uri)
        with _quiet_warnings():
            source = resolve_dataset_source(uri)
        dataset = MetaDataset(source=source, name=name, digest=digest.removeprefix("sha256:")[:36])
        tags = [InputTag("mlflow.data.context", context)]
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags)])

    def log_artifact(self, name: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            parent = str(Path(name).parent)
            self.client.log_artifact(self.run_id, str(path), None if parent == "." else parent)


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@functools.lru_cache(maxsize=None)
def _client(tracking_uri: str):
    """One client per tracking URI and process (creating one costs seconds with a SQLite store; a new SQLite store
    starts migrated: :mod:`fourm_kfp.contract.sqlite_tracking`)."""
    from mlflow.tracking import MlflowClient

    from fourm_kfp.contract.sqlite_tracking import prepare_new_store

    prepare_new_store(tracking_uri)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=tracking_uri)


#: The kind MLflow 3 records for an experiment (set to model training when missing, a kind chosen in the UI is left
#: alone). It does not decide which mode the UI's pages open in: the address does (:data:`UI_MODEL_TRAINING`).
EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"


def _experiment_id(client, tracking_uri: str) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # a kind chosen in the UI is left alone
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return experiment.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        # Keep artifacts beside the database instead of in ./mlruns of whatever the current directory is.
        location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    try:
        return client.create_experiment(EXPERIMENT, artifact_location=location,
                                        tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
    except Exception:  # created concurrently by another process
        return client.get_experiment_by_name(EXPERIMENT).experiment_id


#: MLflow 3's UI shows an experiment and its runs in its GenAI mode (traces, "Evaluations") unless the page's address
#: asks for model training: the experiment tag above does not switch it (MLflow 3.17, tried in a browser); this does.
UI_MODEL_TRAINING = "?workflowType=machine_learning"


def run_page(tracking_uri: str, run_id: str) -> str:
    """The MLflow UI's path of a run, relative to the UI's address, opened in model training:
    ``#/experiments/<id>/runs/<run id>?workflowType=machine_learning``."""
    experiment_id = _client(tracking_uri).get_run(run_id).info.experiment_id
    return f"#/experiments/{experiment_id}/runs/{run_id}{UI_MODEL_TRAINING}"


def experiment_page(tracking_uri: str) -> str:
    """The MLflow UI's path of the runs table of this package's experiment (model training)."""
    return f"#/experiments/{_experiment_id(_client(tracking_uri), tracking_uri)}/runs{UI_MODEL_TRAINING}"


def model_version_page(model_name: str, version: str) -> str:
    """The MLflow UI's path of a registered model version (its aliases, tags and source run)."""
    return f"#/models/{model_name}/versions/{version}{UI_MODEL_TRAINING}"


def _source_commit() -> str | None:
    """The commit this package's code comes from: the image's ``FOURM_GIT_COMMIT`` build arg, else the checkout's
    HEAD (a checkout with local edits reports the commit it started from; the manifest records the edits)."""
    from fourm_kfp.contract.manifest import git_commit

    commit = git_commit()
    return commit.removesuffix("-dirty") if commit else None


def context_tags(source_name: str, kfp_run_id: str | None = None) -> dict[str, str]:
    """MLflow's standard context tags for a run this package opens: what MLflow's own context providers resolve
    (``mlflow.user``, and the tags of ``MLFLOW_RUN_CONTEXT``), the source named ``source_name``, typed ``JOB``
    under a KFP run (else ``LOCAL``), and ``mlflow.source.git.commit`` when the commit is known."""
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

    tags = {**resolve_tags(), MLFLOW_SOURCE_NAME: source_name, MLFLOW_SOURCE_TYPE: "JOB" if kfp_run_id else "LOCAL"}
    commit = _source_commit()
    if commit:
        tags[MLFLOW_GIT_COMMIT] = commit
    return tags


def _kfp_link(client, parent_run_id: str | None) -> dict[str, str]:
    """The KFP run of the pipeline run ``parent_run_id``, as a stage run's tags: its id and, when the parent knows
    the KFP host, its page in the KFP UI."""
    if not parent_run_id:
        return {}
    parent_tags = client.get_run(parent_run_id).data.tags
    kfp_run_id = parent_tags.get(TAG_KFP_RUN_ID)
    if not kfp_run_id:
        return {}
    link = {TAG_KFP_RUN_ID: kfp_run_id}
    if parent_tags.get(TAG_KFP_HOST):
        link[TAG_KFP_RUN_URL] = kfp_run_page(parent_tags[TAG_KFP_HOST], kfp_run_id)
    return link


def kfp_run_page(host: str, kfp_run_id: str) -> str:
    """The KFP UI's page of a run: ``<host>/#/runs/details/<run id>``."""
    return f"{host.rstrip('/')}/#/runs/details/{kfp_run_id}"


def start_pipeline_run(tracking_uri: str | None, run_name: str, params: Mapping[str, Any],
                       tags: Mapping[str, str] | None = None) -> str | None:
    """Open the parent run of a pipeline run; returns its id (``None`` with lineage off)."""
    if tracking_uri is None:
        return None
    client = _client(tracking_uri)
    tags = dict(tags or {})
    run = client.create_run(_experiment_id(client, tracking_uri), run_name=run_name,
                            tags={**context_tags("fourm-kfp pipeline", tags.get(TAG_KFP_RUN_ID)),
                                  "fourm.kind": "pipeline", **tags})
    tracker = MLflowTracker(client, run.info.run_id)
    tracker.log_params(params)
    return run.info.run_id


def finish_run(tracking_uri: str | None, run_id: str | None, status: str = "FINISHED") -> None:
    """Close a run as ``FINISHED``, ``FAILED`` or ``KILLED``."""
    if tracking_uri and run_id:
        _client(tracking_uri).set_terminated(run_id, status=status)


def attach_artifact(tracking_uri: str | None, run_id: str | None, name: str, data: bytes) -> None:
    """Attach a file to an existing run (open or finished), e.g. a launcher's job spec to the stage's run."""
    if tracking_uri and run_id:
        MLflowTracker(_client(tracking_uri), run_id).log_artifact(name, data)


def read_artifact(tracking_uri: str, run_id: str, name: str) -> bytes | None:
    """A file attached to a run, or None when it has none by that name."""
    from mlflow.exceptions import MlflowException

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file: no progress bar
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = _client(tracking_uri).download_artifacts(run_id, name, tmp)
        except (MlflowException, OSError):
            return None
        return Path(path).read_bytes()


@contextlib.contextmanager
def stage_run(tracking_uri: str | None, parent_run_id: str | None, stage: str,
              kind: str = "stage") -> Iterator[Tracker]:
    """A child run for one stage (``kind="part"``: one fan-out worker of a stage) under ``parent_run_id``;
    closed FAILED if the body raises."""
    if tracking_uri is None:
        yield NullTracker()
        return
    client = _client(tracking_uri)
    kfp_link = _kfp_link(client, parent_run_id)
    tags = {**context_tags(f"fourm-kfp stage {stage}", kfp_link.get(TAG_KFP_RUN_ID)), **kfp_link,
            TAG_STAGE: stage, TAG_KIND: kind}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(_experiment_id(client, tracking_uri), run_name=stage, tags=tags)
    tracker = MLflowTracker(client, run.info.run_id, tracking_uri, parent_run_id)
    try:
        yield tracker
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        raise
    client.set_terminated(run.info.run_id, status="FINISHED")


def child_runs(tracking_uri: str, parent_run_id: str, kind: str = "stage") -> list:
    """The stage runs (or fan-out part runs) under a pipeline run, oldest first."""
    client = _client(tracking_uri)
    experiment_id = _experiment_id(client, tracking_uri)
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' "
                                                              f"and tags.`{TAG_KIND}` = '{kind}'")
    return sorted(runs, key=lambda r: r.info.start_time)


def latest_pipeline_run(tracking_uri: str) -> str | None:
    """The id of the newest pipeline (parent) run in the store, if any."""
    run = find_run_by_tag(tracking_uri, TAG_KIND, "pipeline")
    return run.info.run_id if run is not None else None


def find_run_by_tag(tracking_uri: str, key: str, value: str, kind: str | None = None):
    """The newest run carrying tag ``key=value`` (``None`` if there is none); of ``kind`` (``pipeline``, ``stage``,
    ``part``) only, when given: a stage run carries its pipeline run's KFP run id too."""
    client = _client(tracking_uri)
    where = f"tags.`{key}` = '{value}'" + (f" and tags.`{TAG_KIND}` = '{kind}'" if kind else "")
    runs = client.search_runs([_experiment_id(client, tracking_uri)], filter_string=where,
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None
