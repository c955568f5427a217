"""The MLflow parent run closes with the run's real outcome at every supported KFP version, whatever the exit handler
is told, with retried and lost attempts (``tests/kfp_driver_emulator.py``: ``final_status_after_attempts`` on the
compiled pipeline gives the ``PipelineTaskFinalStatus.state`` each version sends).

Each stage's *latest* MLflow run decides (:func:`fourm_kfp.launchers.kfp_lineage.stage_runs_outcome`): a retry that
succeeds closes the parent FINISHED though its failed first attempt left a FAILED stage run and, before 2.17, the
exit handler is told FAILED; a launcher pod deleted and not retried (KFP compiles no retryPolicy: Argo's OnFailure
does not retry its Error) closes it FAILED; a stage run that was KILLED counts as a failure.
"""

from __future__ import annotations

import time
import uuid

import pytest
import yaml

from fourm_kfp.contract import lineage
from fourm_kfp.launchers.kfp_lineage import close_lineage_step, open_lineage_step
from fourm_kfp.launchers.kfp_placement import pod_placement
from fourm_kfp.pipeline_runs.compile import compile_pipeline
from fourm_kfp.stages import STAGES
from tests.kfp_driver_emulator import (FAILS, POD_DELETED, PROPAGATING_STATES, SUCCEEDS, VERSIONS, at_least,
                                       final_status_after_attempts, stub_outputs)

PRETRAIN = "exit-handler-1/pretrain"
BEFORE = list(STAGES)[:list(STAGES).index("pretrain")]
AFTER = list(STAGES)[list(STAGES).index("pretrain") + 1:]


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One tracking store for the module's runs (each case has its own KFP run and parent run)."""
    return lineage.default_tracking_uri(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return next(yaml.safe_load_all(compile_pipeline(tmp_path_factory.mktemp("p") / "p.yaml").read_text()))


def _state(spec, version: str, outcomes: list[str], finalizer: bool = False):
    outputs = stub_outputs(spec, components={"comp-pod-placement": pod_placement})
    return final_status_after_attempts(spec, version, PRETRAIN, outcomes, finalizer,
                                       parameters={"image_pull_secret": "ghcr-pull"}, task_outputs=outputs)


def _stage_runs(tracking: str, parent: str, runs: list[tuple[str, str]]) -> list:
    """Stage runs as the stages open them (``lineage.stage_run``), in order, each ending with its status: FINISHED,
    FAILED (the stage raised), RUNNING (its pod deleted under it: never closed) or KILLED (stopped). Returns the
    contexts of the RUNNING ones, to hold while the run is judged (a context collected closes its run FAILED)."""
    client, open_runs = lineage._client(tracking), []
    for stage, status in runs:
        time.sleep(0.002)  # attempts start apart
        context = lineage.stage_run(tracking, parent, stage)
        tracker = context.__enter__()
        if status == "RUNNING":
            open_runs.append(context)
            continue
        try:
            if status == "FAILED":
                raise RuntimeError(stage)
        except RuntimeError as error:
            context.__exit__(RuntimeError, error, None)
        else:
            context.__exit__(None, None, None)
        if status == "KILLED":
            client.set_terminated(tracker.run_id, status="KILLED")
    assert [(r.data.tags[lineage.TAG_STAGE], r.info.status) for r in lineage.child_runs(tracking, parent)] == runs
    return open_runs


def _closed(tracking: str, state: str, runs: list[tuple[str, str]]) -> str:
    """The status the parent run of a KFP run whose stages ran ``runs`` closes with, told ``state``."""
    kfp_run_id = str(uuid.uuid4())
    parent = open_lineage_step("", kfp_run_id, "smoke", [], "/x", tracking, "")
    open_runs = _stage_runs(tracking, parent, runs)
    close_lineage_step("", kfp_run_id, tracking, "", state)
    status = lineage._client(tracking).get_run(parent).info.status
    assert [(r.data.tags[lineage.TAG_STAGE], r.info.status) for r in lineage.child_runs(tracking, parent)] == runs
    del open_runs  # held until now: the lost attempts' runs were RUNNING when the parent was judged
    return status


def _finished(stages) -> list[tuple[str, str]]:
    return [(stage, "FINISHED") for stage in stages]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_retry_that_succeeds_closes_the_parent_finished(spec, version, tracking):
    """pretrain in its own pod fails once and succeeds on its retry: its first stage run FAILED, its second FINISHED.
    2.15 and 2.16 tell the exit handler FAILED; 2.17 COMPLETE."""
    state, attempts = _state(spec, version, [FAILS, SUCCEEDS])
    assert attempts.succeeded
    assert state == ("COMPLETE" if at_least(version, PROPAGATING_STATES) else "FAILED")
    runs = [*_finished(BEFORE), ("pretrain", "FAILED"), ("pretrain", "FINISHED"), *_finished(AFTER)]
    assert _closed(tracking, state, runs) == "FINISHED"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("finalizer", [False, True])
def test_a_lost_launcher_closes_the_parent_by_whether_argo_retried_it(spec, version, finalizer, tracking):
    """pretrain's launcher pod is deleted under it (its stage run left RUNNING). Without the status-capture finalizer
    Argo does not retry it: the run fails, the exit handler is told RUNNING, the parent closes FAILED. With it the
    retry adopts the job and the run succeeds (COMPLETE from 2.17, RUNNING before: the loops)."""
    state, attempts = _state(spec, version, [POD_DELETED, SUCCEEDS], finalizer)
    assert attempts.succeeded == finalizer
    if finalizer:
        assert state == ("COMPLETE" if at_least(version, PROPAGATING_STATES) else "RUNNING")
        runs = [*_finished(BEFORE), ("pretrain", "RUNNING"), ("pretrain", "FINISHED"), *_finished(AFTER)]
        assert _closed(tracking, state, runs) == "FINISHED"
    else:
        assert state == "RUNNING"
        assert _closed(tracking, state, [*_finished(BEFORE), ("pretrain", "RUNNING")]) == "FAILED"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_step_that_fails_for_good_closes_the_parent_failed(spec, version, tracking):
    state, attempts = _state(spec, version, [FAILS] * 4)  # the launcher's retries spent
    assert not attempts.succeeded and state == "FAILED"
    assert _closed(tracking, state, [*_finished(BEFORE), *[("pretrain", "FAILED")] * 4]) == "FAILED"


@pytest.mark.parametrize("state", ["FAILED", "RUNNING"])
@pytest.mark.parametrize("killed", [s for s in STAGES if s != list(STAGES)[-1]])
def test_a_killed_stage_run_is_a_failure(tracking, state, killed):
    """A stage whose latest run was KILLED failed, though evaluate finished after it."""
    runs = [(stage, "KILLED" if stage == killed else "FINISHED") for stage in STAGES]
    assert _closed(tracking, state, runs) == "FAILED"


def test_an_earlier_killed_attempt_does_not_count(tracking):
    runs = [*_finished(BEFORE), ("pretrain", "KILLED"), ("pretrain", "FINISHED"), *_finished(AFTER)]
    assert _closed(tracking, "FAILED", runs) == "FINISHED"


@pytest.mark.parametrize("state", ["COMPLETE", "SUCCEEDED", "CANCELED"])
def test_a_state_taken_at_its_word(tracking, state):
    """COMPLETE is set only when every task completed (kfp.local: SUCCEEDED); a stopped run failed, whatever its
    stage runs say."""
    expected = "FAILED" if state == "CANCELED" else "FINISHED"
    assert _closed(tracking, state, [("prepare-data", "FAILED")] if expected == "FINISHED"
                   else _finished(STAGES)) == expected
