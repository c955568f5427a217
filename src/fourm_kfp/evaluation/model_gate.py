"""The model gate: register an evaluated model in the MLflow model registry and promote it when it is better.

Every evaluated model becomes a new version of a registered model (created on first use) whose source is the
pretrain output URI: the exported ``model/`` folder with its card, a local path or an ``s3://`` URI, not an
MLflow-format model. The version is linked to the evaluate stage's run, carries its lineage as tags
(``fourm.<key>``: data, tokenizers, pretokenized data and model URIs, content addresses, manifest digests, pipeline
and evaluate run ids; ``fourm.source`` is always the model folder) and every metric as ``metric.<name>``, so a
later gate reads the champion's score from the registry alone, without looking up runs.

The version gets the alias ``candidate``, and takes the alias ``champion`` when

* there is no champion yet, or the champion has no (finite) value of the primary metric, or
* it beats the champion's value ``old`` by the relative ``margin``: higher is better: ``new >= old + margin*|old|``,
  lower is better: ``new <= old - margin*|old|``, and strictly better in both cases (a tie never moves the
  champion, even with ``margin=0``). ``|old|`` keeps the rule meaningful for negative scores; a champion scoring
  exactly 0 is beaten by any strict improvement (a relative margin of 0 is 0).

A non-finite score (NaN, inf) is registered but never promoted. The version is tagged ``fourm.gate``
(``promoted``/``refused``) and ``fourm.gate_reason``. Aliases only move once the version exists, and MLflow drops a
version's aliases when the version is deleted, so ``champion`` never names a missing version; running the gate
twice registers two versions (the second, tying the first, is refused).

Model version sources, as MLflow 3.17 treats them:

* the embedded SQLite store (``sqlite:///<root>/mlflow.db``) stores any source as given: a plain absolute path,
  a ``file://`` URI, ``s3://``; a local path is registered as an absolute plain path;
* a tracking server (``http(s)://``) accepts object-store URIs (``s3://``, ``gs://``, ...), but refuses local paths
  *and* ``file://`` URIs ("To use a local path as a model version source, the run_id request parameter has to be
  specified and the local path has to be contained within the artifact directory of the run"), as well as
  sources with ``..``. A pipeline in the cluster registers ``s3://`` URIs, which is fine. When a server refuses a
  local model folder, the version is registered with the documented run source ``runs:/<evaluate run id>/``
  (the evaluate run's artifacts: its report) instead, and the folder stays in the ``fourm.source`` tag, which
  :func:`champion_info` reports as the source. Without a run id that is impossible: :class:`ValueError`.
"""

from __future__ import annotations

import logging
import math
import os
import urllib.parse
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from fourm_kfp.contract.lineage import _client, _quiet_warnings
from fourm_kfp.evaluation.task_metrics import beats

log = logging.getLogger(__name__)

CANDIDATE, CHAMPION = "candidate", "champion"
METRIC_TAG = "metric."
TAG_PREFIX = "fourm."
TAG_SOURCE, TAG_GATE, TAG_GATE_REASON = "fourm.source", "fourm.gate", "fourm.gate_reason"
DESCRIPTION = "4M models pre-trained by fourm-kfp"


@dataclass(frozen=True)
class GateDecision:
    """What the gate did with one evaluated model."""

    model_name: str
    version: str  # the registered version of this model
    promoted: bool  # became the ``champion``
    reason: str  # one human sentence
    primary_metric: str
    value: float
    champion_version: str | None  # the previous champion (None if there was none)
    champion_value: float | None  # its primary metric (None if none, or it had none)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_local(uri: str) -> bool:
    return urllib.parse.urlparse(uri).scheme in ("", "file")


def _float(text: str | None) -> float:
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan


def _metric_tags(tags: Mapping[str, str]) -> dict[str, float]:
    return {k[len(METRIC_TAG):]: _float(v) for k, v in tags.items() if k.startswith(METRIC_TAG)}


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _decide(name: str, value: float, champion, higher: bool, margin: float) -> tuple[bool, str, float | None]:
    """(promote?, reason, the champion's value)."""
    if not math.isfinite(value):
        return False, f"{name} is {value}, and a non-finite score is never promoted", None
    if champion is None:
        return True, f"no champion yet ({name} {_fmt(value)})", None
    old = _float(champion.tags.get(METRIC_TAG + name))
    if not math.isfinite(old):
        lacks = "has no" if math.isnan(old) else f"has a non-finite ({old})"
        return True, f"champion v{champion.version} {lacks} {name}; {name} {_fmt(value)} takes over", None
    direction = "higher" if higher else "lower"
    if beats(value, old, higher, margin):
        change = f"{abs(value - old) / abs(old):.0%}" if old else "any amount (champion scored 0)"
        return True, (f"{name} {_fmt(value)} beats champion v{champion.version} ({_fmt(old)}) by {change} "
                      f"(margin {margin:.0%}, {direction} is better)"), old
    return False, (f"{name} {_fmt(value)} does not beat champion v{champion.version} ({_fmt(old)}) by the "
                   f"{margin:.0%} margin ({direction} is better)"), old


def _ensure_registered_model(client, model_name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(model_name)
        return
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    try:
        client.create_registered_model(model_name, description=DESCRIPTION)
    except MlflowException as error:  # created concurrently by another gate
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _create_version(client, model_name: str, source: str, run_id: str | None, tags: dict[str, str]):
    from mlflow.exceptions import MlflowException

    description = f"fourm-kfp model from {source}"
    try:
        return client.create_model_version(model_name, source, run_id=run_id, tags=tags, description=description)
    except MlflowException as error:
        refused = error.error_code == "INVALID_PARAMETER_VALUE" and "model version source" in str(error)
        if not (refused and _is_local(source)):
            raise
        if not run_id:
            raise ValueError(f"the tracking server refuses the local model folder {source!r} as a model version "
                             "source (it only takes object-store URIs such as s3://, or runs:/ URIs with the run "
                             "id); write the model to S3, or pass the evaluate run id") from error
    fallback = f"runs:/{run_id}/"
    log.warning("the tracking server refuses the local path %s as a model version source; registering %s "
                "(the evaluate run) instead, the model folder is in the %s tag", source, fallback, TAG_SOURCE)
    return client.create_model_version(model_name, fallback, run_id=run_id, tags=tags, description=description)


def _champion(client, model_name: str):
    """The version holding ``champion`` (``None`` if no version does); read from the model's alias map, so an
    unreachable server raises instead of looking like an empty registry."""
    version = client.get_registered_model(model_name).aliases.get(CHAMPION)
    return None if version is None else client.get_model_version(model_name, str(version))


def register_and_gate(tracking_uri: str, *, model_name: str, model_uri: str, run_id: str | None,
                      metrics: Mapping[str, float], primary_metric: str, higher_is_better: bool, margin: float,
                      lineage: Mapping[str, str]) -> GateDecision:
    """Register ``model_uri`` as a new version of ``model_name`` and apply the gate (see the module docstring).

    Raises :class:`ValueError` before touching the registry when ``primary_metric`` is not in ``metrics`` or
    ``margin`` is negative or not finite."""
    if primary_metric not in metrics:
        raise ValueError(f"evaluate.gate.metric: {primary_metric!r} is not among the evaluation's metrics "
                         f"({', '.join(sorted(metrics)) or 'none'})")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"evaluate.gate.margin must be a finite fraction >= 0, got {margin}")
    value = float(metrics[primary_metric])
    source = os.path.abspath(model_uri) if urllib.parse.urlparse(model_uri).scheme == "" else model_uri

    tags = {k if k.startswith(TAG_PREFIX) else TAG_PREFIX + k: str(v) for k, v in lineage.items()}
    tags[TAG_SOURCE] = source
    tags |= {METRIC_TAG + k: repr(float(v)) for k, v in metrics.items()}

    client = _client(tracking_uri)
    with _quiet_warnings():
        _ensure_registered_model(client, model_name)
        version = str(_create_version(client, model_name, source, run_id, tags).version)
        champion = _champion(client, model_name)
        promoted, reason, old = _decide(primary_metric, value, champion, higher_is_better, margin)
        client.set_registered_model_alias(model_name, CANDIDATE, version)
        if promoted:
            client.set_registered_model_alias(model_name, CHAMPION, version)
        client.set_model_version_tag(model_name, version, TAG_GATE, "promoted" if promoted else "refused")
        client.set_model_version_tag(model_name, version, TAG_GATE_REASON, reason)
    return GateDecision(model_name=model_name, version=version, promoted=promoted, reason=reason,
                        primary_metric=primary_metric, value=value,
                        champion_version=None if champion is None else str(champion.version), champion_value=old)


def champion_info(tracking_uri: str, model_name: str) -> dict[str, Any] | None:
    """The current champion of ``model_name``: ``{"version", "source", "registry_source", "run_id", "metrics",
    "tags"}`` (metrics read from its ``metric.*`` tags, the other tags as they are; ``source`` is the model folder);
    ``None`` if the model is not registered or has no champion."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    with _quiet_warnings():
        try:
            champion = _champion(client, model_name)
        except MlflowException as error:
            if error.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
    if champion is None:
        return None
    tags = dict(champion.tags)
    return {"version": str(champion.version), "source": tags.get(TAG_SOURCE, champion.source),
            "registry_source": champion.source, "run_id": champion.run_id or None, "metrics": _metric_tags(tags),
            "tags": {k: v for k, v in tags.items() if not k.startswith(METRIC_TAG)}}
