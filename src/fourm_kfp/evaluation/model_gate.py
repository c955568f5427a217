"""The model gate: register an evaluated model in the MLflow model registry and promote it when it is better.

Every evaluated model becomes a new version of a registered model (created on first use). The evaluate stage logs it
as an MLflow model of its run (a pyfunc, :mod:`fourm_kfp.evaluation.mlflow_model`) and passes its model id: the
version's source is then ``models:/<model id>``, so ``mlflow.pyfunc.load_model("models:/<name>@champion")`` loads
it, and the evaluation's metrics are logged linked to that model (MLflow 3's model metrics). Without a logged model
(a caller passing none) the source is the pretrain output URI itself: the exported ``model/`` folder with its card,
a local path or an ``s3://`` URI, not an MLflow-format model. The version is linked to the evaluate stage's run,
carries its lineage as tags (``fourm.<key>``: data, tokenizers, pretokenized data and model URIs, content addresses,
manifest digests, pipeline and evaluate run ids; ``fourm.source`` is always the model folder) and every metric as
``metric.<name>``, so a later gate reads the champion's score from the registry alone, without looking up runs.

The version gets the alias ``candidate``, and takes the alias ``champion`` when

* there is no champion yet, or the champion has no (finite) value of the primary metric, or
* it beats the champion's value ``old`` by the relative ``margin`` *with confidence*: the evaluate run stores the
  per-scene statistics of its metrics (``reports/scene_scores.json``, an artifact of its MLflow run, see
  :func:`scene_scores`); the gate downloads the champion's from the champion version's run and bootstraps the
  improvement (signed: positive = better) over the val scenes (:mod:`fourm_kfp.evaluation.paired_bootstrap`) --
  paired when both were scored on the same scene keys, unpaired otherwise. The candidate is promoted when the 95%
  interval's lower bound is above ``margin*|old|`` (with ``margin=0``: the interval excludes zero; a tie never
  moves the champion). ``|old|`` keeps the rule meaningful for negative scores.
* When the champion has no scene scores (a version from before them, or registered without a run), or either side
  lacks the metric's statistics, the point rule applies and the reason says so: higher is better:
  ``new >= old + margin*|old|``, lower is better: ``new <= old - margin*|old|``, and strictly better in both cases;
  a champion scoring exactly 0 is beaten by any strict improvement (a relative margin of 0 is 0).

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

import json
import logging
import math
import os
import tempfile
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from fourm_kfp.contract.lineage import _client, _quiet_warnings
from fourm_kfp.evaluation import paired_bootstrap
from fourm_kfp.evaluation.scene_stats import SceneStats
from fourm_kfp.evaluation.scene_stats_reader import read_scene_stats
from fourm_kfp.evaluation.targets import beats

log = logging.getLogger(__name__)

CANDIDATE, CHAMPION = "candidate", "champion"
METRIC_TAG = "metric."
TAG_PREFIX = "fourm."
TAG_SOURCE, TAG_GATE, TAG_GATE_REASON = "fourm.source", "fourm.gate", "fourm.gate_reason"
DESCRIPTION = "4M models pre-trained by fourm-kfp"
#: The evaluate run's artifact with the per-scene statistics of its metrics.
SCENE_SCORES = "reports/scene_scores.json"
SCENE_SCORES_FORMAT = 1
_PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


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
    #: how the champion was compared: "paired bootstrap", "unpaired bootstrap", "point" (no scene scores to
    #: bootstrap), or "none" (no champion to compare with, or a non-finite score)
    comparison: str = "none"
    #: the improvement over the champion (signed: positive = better) and its 95% bootstrap interval (None without
    #: a bootstrap; ``difference`` is then the point difference, when there is a champion value)
    difference: float | None = None
    interval_low: float | None = None
    interval_high: float | None = None
    resamples: int | None = None
    required: float | None = None  # what the lower bound (or, by the point rule, the difference) had to exceed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scene_scores(groups: Mapping[str, tuple[Sequence[str], SceneStats]]) -> dict[str, Any]:
    """The scene-scores document of an evaluation: per group (a metric-name prefix: ``""`` for the masked-modeling
    metrics ``val.*``, ``"<task>."`` for a task's), the scene keys and the per-scene statistics of its metrics."""
    return {"format": SCENE_SCORES_FORMAT,
            "groups": [{"prefix": prefix, "keys": list(keys), "stats": stats.to_json()}
                       for prefix, (keys, stats) in groups.items()]}


def _scene_statistic(doc: Mapping[str, Any] | None,
                     metric: str) -> tuple[list[str], paired_bootstrap.Statistic] | None:
    """The scene keys and the bootstrap statistic of ``metric`` in a scene-scores document (None if it has none)."""
    for group in (doc or {}).get("groups", []):
        if metric.startswith(group["prefix"]):
            stats = read_scene_stats(group["stats"])
            name = metric[len(group["prefix"]):]
            if name in stats.whole():
                return list(group["keys"]), stats.statistic(name)
    return None


def _champion_scene_scores(client, champion) -> dict[str, Any] | None:
    """The champion's scene-scores document, from its version's run (None if it has no run or no such
    artifact)."""
    from mlflow.exceptions import MlflowException

    if not champion.run_id:
        return None
    bar = os.environ.get(_PROGRESS_BAR)
    os.environ[_PROGRESS_BAR] = "false"  # one small file: no progress bar in the stage's log
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(champion.run_id, SCENE_SCORES, tmp)
            return json.loads(Path(path).read_text())
    except (MlflowException, OSError) as error:
        log.info("champion v%s: no %s in run %s (%s)", champion.version, SCENE_SCORES, champion.run_id, error)
        return None
    finally:
        if bar is None:
            os.environ.pop(_PROGRESS_BAR, None)
        else:
            os.environ[_PROGRESS_BAR] = bar


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


@dataclass(frozen=True)
class _Verdict:
    promoted: bool
    reason: str
    old: float | None = None
    comparison: str = "none"
    difference: float | None = None
    interval: paired_bootstrap.Interval | None = None
    required: float | None = None


def _decide(name: str, value: float, champion, higher: bool, margin: float, candidate_scores, champion_scores
            ) -> _Verdict:
    """Apply the gate (module docstring). ``candidate_scores``: the candidate's scene-scores document (or None);
    ``champion_scores``: ``champion -> its document or None``, called only when a bootstrap is possible."""
    if not math.isfinite(value):
        return _Verdict(False, f"{name} is {value}, and a non-finite score is never promoted")
    if champion is None:
        return _Verdict(True, f"there was no champion, so this version became the champion ({name} {_fmt(value)})")
    old = _float(champion.tags.get(METRIC_TAG + name))
    if not math.isfinite(old):
        lacks = "has no" if math.isnan(old) else f"has a non-finite ({old})"
        return _Verdict(True, f"champion v{champion.version} {lacks} {name}; {name} {_fmt(value)} takes over")
    direction = "higher" if higher else "lower"
    required = margin * abs(old)
    mine = _scene_statistic(candidate_scores, name)
    if mine is None:
        return _point(name, value, old, champion, higher, margin, f"the candidate has no per-scene scores of {name}")
    theirs = _scene_statistic(champion_scores(champion), name)
    if theirs is None:
        return _point(name, value, old, champion, higher, margin,
                      f"champion v{champion.version} has no per-scene scores of {name} ({SCENE_SCORES})")
    (keys, new_stat), (old_keys, old_stat) = mine, theirs
    if len(set(keys)) == len(keys) == len(old_keys) and set(keys) == set(old_keys):
        column = {key: i for i, key in enumerate(keys)}
        order = [column[key] for key in old_keys]  # the champion's scenes as columns of the candidate's counts
        interval = paired_bootstrap.paired(new_stat, lambda counts: old_stat(counts[:, order]), len(keys), higher)
        how = f"paired bootstrap over the same {len(keys)} val scenes"
    else:
        interval = paired_bootstrap.unpaired(new_stat, len(keys), old_stat, len(old_keys), higher)
        how = (f"unpaired bootstrap: the candidate's {len(keys)} val scenes and the champion's {len(old_keys)} "
               f"are not the same scenes")
    comparison = "paired bootstrap" if interval.paired else "unpaired bootstrap"
    promoted = interval.clears(required)
    verdict = "beats" if promoted else "does not beat"
    reason = (f"{name} {_fmt(value)} {verdict} champion v{champion.version} ({_fmt(old)}) with confidence: "
              f"improvement {_fmt(interval.difference)}, 95% interval [{_fmt(interval.low)}, "
              f"{_fmt(interval.high)}] ({how}, {interval.resamples} resamples); its lower bound must exceed "
              f"{_fmt(required)} (margin {margin:.0%} of |champion|, {direction} is better)")
    return _Verdict(promoted, reason, old, comparison, interval.difference, interval, required)


def _point(name: str, value: float, old: float, champion, higher: bool, margin: float, why: str) -> _Verdict:
    """The point rule (:func:`beats`), used when there are no scene scores to bootstrap."""
    direction = "higher" if higher else "lower"
    difference = value - old if higher else old - value
    if beats(value, old, higher, margin):
        change = f"{abs(value - old) / abs(old):.0%}" if old else "any amount (champion scored 0)"
        reason = (f"{name} {_fmt(value)} beats champion v{champion.version} ({_fmt(old)}) by {change} "
                  f"(margin {margin:.0%}, {direction} is better)")
        promoted = True
    else:
        reason = (f"{name} {_fmt(value)} does not beat champion v{champion.version} ({_fmt(old)}) by the "
                  f"{margin:.0%} margin ({direction} is better)")
        promoted = False
    return _Verdict(promoted, f"{reason}; point rule, no bootstrap: {why}", old, "point", difference,
                    required=margin * abs(old))


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


def _create_version(client, model_name: str, source: str, run_id: str | None, tags: dict[str, str],
                    logged_model_id: str | None = None):
    from mlflow.exceptions import MlflowException

    description = f"fourm-kfp model from {source}"
    if logged_model_id:  # the MLflow model (pyfunc) logged by the evaluate run: what models:/ URIs load
        return client.create_model_version(model_name, f"models:/{logged_model_id}", run_id=run_id, tags=tags,
                                           description=description, model_id=logged_model_id)
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


def _log_model_metrics(client, run_id: str, model_id: str, metrics: Mapping[str, float]) -> None:
    """``metrics`` (the finite ones) logged to the run, linked to the logged model ``model_id``."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(key, float(value), now, 0, model_id=model_id)
                                      for key, value in metrics.items() if math.isfinite(float(value))])


def _champion(client, model_name: str):
    """The version holding ``champion`` (``None`` if no version does); read from the model's alias map, so an
    unreachable server raises instead of looking like an empty registry."""
    version = client.get_registered_model(model_name).aliases.get(CHAMPION)
    return None if version is None else client.get_model_version(model_name, str(version))


def register_and_gate(tracking_uri: str, *, model_name: str, model_uri: str, run_id: str | None,
                      metrics: Mapping[str, float], primary_metric: str, higher_is_better: bool, margin: float,
                      lineage: Mapping[str, str], scene_scores: Mapping[str, Any] | None = None,
                      logged_model_id: str | None = None) -> GateDecision:
    """Register ``model_uri`` as a new version of ``model_name`` and apply the gate (see the module docstring).

    ``scene_scores``: the candidate's scene-scores document (:func:`scene_scores`; the evaluate run also logs it as
    :data:`SCENE_SCORES`, where a later gate finds it when this version is the champion).
    ``logged_model_id``: the MLflow model logged from ``model_uri``
    (:func:`fourm_kfp.evaluation.mlflow_model.log_pyfunc`): the version is registered from it (source
    ``models:/<id>``, so ``models:/<name>@champion`` loads with ``mlflow.pyfunc.load_model``) and ``metrics`` are
    logged to ``run_id`` linked to it (MLflow 3's model metrics).

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

    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    client = _client(tracking_uri)
    with _quiet_warnings():
        _ensure_registered_model(client, model_name)
        if logged_model_id and run_id:
            _log_model_metrics(client, run_id, logged_model_id, metrics)
        # The SQL registry resolves a models:/ source through the global tracking URI: this store's, meanwhile.
        with _use_tracking_uri(tracking_uri):
            version = str(_create_version(client, model_name, source, run_id, tags, logged_model_id).version)
        champion = _champion(client, model_name)
        verdict = _decide(primary_metric, value, champion, higher_is_better, margin, scene_scores,
                          lambda champ: _champion_scene_scores(client, champ))
        client.set_registered_model_alias(model_name, CANDIDATE, version)
        if verdict.promoted:
            client.set_registered_model_alias(model_name, CHAMPION, version)
        client.set_model_version_tag(model_name, version, TAG_GATE, "promoted" if verdict.promoted else "refused")
        client.set_model_version_tag(model_name, version, TAG_GATE_REASON, verdict.reason)
    interval = verdict.interval
    return GateDecision(model_name=model_name, version=version, promoted=verdict.promoted, reason=verdict.reason,
                        primary_metric=primary_metric, value=value,
                        champion_version=None if champion is None else str(champion.version),
                        champion_value=verdict.old, comparison=verdict.comparison, difference=verdict.difference,
                        interval_low=None if interval is None else interval.low,
                        interval_high=None if interval is None else interval.high,
                        resamples=None if interval is None else interval.resamples, required=verdict.required)


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
