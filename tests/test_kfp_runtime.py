"""What the pipeline's steps call, as they run in the cluster: the lineage steps (no launcher-provided parent run),
the overrides and metrics a step passes on, and a forced fan-out stage's fan-out step, workers and collect step."""

from __future__ import annotations

import json

import pytest

from fourm_kfp.contract import lineage
from fourm_kfp.config.schema import ConfigError
from fourm_kfp.contract.manifest import MANIFEST_NAME, payload_files
from fourm_kfp.launchers.kfp_lineage import close_lineage_step, open_lineage_step
from fourm_kfp.launchers.kfp_placement import fan_out_items
from fourm_kfp.launchers.kfp_steps import run_stage_component, run_stage_part_component
from fourm_kfp.storage import open_store


@pytest.mark.parametrize("state, expected", [("SUCCEEDED", "FINISHED"), ("FAILED", "FAILED")])
def test_pipeline_opens_and_closes_its_own_parent_run(tmp_path, state, expected):
    tracking = lineage.default_tracking_uri(tmp_path)
    run_id = open_lineage_step("", "kfp-run-123", "smoke", ["data.image_size=32"], "s3://b/x", tracking, "")
    run = lineage._client(tracking).get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.tags["fourm.run_label"] == "kfp-run-123"
    assert run.data.params["data.image_size"] == "32" and run.data.params["store_uri"] == "s3://b/x"

    close_lineage_step("", "kfp-run-123", tracking, "", state)
    assert lineage._client(tracking).get_run(run_id).info.status == expected


def _stage_runs(tracking: str, parent: str, stages: dict[str, str]) -> None:
    """Child runs as the stages open them (``lineage.stage_run``), ending with the given statuses."""
    client = lineage._client(tracking)
    for stage, status in stages.items():
        try:
            with lineage.stage_run(tracking, parent, stage):
                if status == "FAILED":
                    raise RuntimeError(stage)
        except RuntimeError:
            pass
    assert [r.info.status for r in lineage.child_runs(tracking, parent)] == list(stages.values())
    assert client.get_run(parent).info.status == "RUNNING"


ALL_STAGES = ("prepare-data", "label", "train-tokenizers", "pretokenize", "pretrain", "evaluate")


@pytest.mark.parametrize("state, stages, expected", [
    ("COMPLETE", {}, "FINISHED"),  # KFP >= 2.17 on success (kubeflow/pipelines#11826)
    ("RUNNING", {s: "FINISHED" for s in ALL_STAGES}, "FINISHED"),  # before 2.17, a loop inside the ExitHandler
    ("RUNNING", {**{s: "FINISHED" for s in ALL_STAGES[:4]}, "pretrain": "FAILED"}, "FAILED"),
    ("RUNNING", {s: "FINISHED" for s in ALL_STAGES[:5]}, "FAILED"),  # stopped before evaluate
    ("CANCELED", {s: "FINISHED" for s in ALL_STAGES}, "FAILED"),
])
def test_the_parent_run_closes_with_the_run_s_real_outcome_whatever_state_the_backend_sends(tmp_path, state, stages,
                                                                                             expected):
    tracking = lineage.default_tracking_uri(tmp_path)
    run_id = open_lineage_step("", "kfp-run-7", "smoke", [], "/x", tracking, "")
    _stage_runs(tracking, run_id, stages)
    close_lineage_step("", "kfp-run-7", tracking, "", state)
    assert lineage._client(tracking).get_run(run_id).info.status == expected


def test_launcher_parent_run_is_passed_through_untouched(tmp_path):
    tracking = lineage.default_tracking_uri(tmp_path)
    parent = lineage.start_pipeline_run(tracking, "launcher", {})
    assert open_lineage_step("label", "kfp-1", "smoke", [], "/x", tracking, parent) == parent
    close_lineage_step("label", "kfp-1", tracking, parent, "FAILED")
    assert lineage._client(tracking).get_run(parent).info.status == "RUNNING"  # the launcher closes its own


@pytest.mark.parametrize("original_followed", [True, False])
def test_a_cloned_run_opens_its_own_parent_run(tmp_path, original_followed):
    """The KFP UI's "Clone run" copies mlflow_parent_run_id and run_label. The original's parent run is closed
    once its run ended (or still claimed by the running original): the clone declines it, opens its own parent
    (another label, tagged with what it declined) and its exit handler closes that one, not the original's."""
    tracking = lineage.default_tracking_uri(tmp_path)
    client = lineage._client(tracking)
    parent = lineage.start_pipeline_run(tracking, "launcher", {})  # what `fourm-kfp submit --wait` opened
    assert open_lineage_step("retrain-1", "kfp-original", "smoke", [], "/x", tracking, parent) == parent
    assert client.get_run(parent).data.tags["fourm.kfp_run_id"] == "kfp-original"  # claimed by the original
    if original_followed:
        lineage.finish_run(tracking, parent, "FINISHED")

    clone = open_lineage_step("retrain-1", "kfp-clone-5678", "smoke", [], "/x", tracking, parent)
    assert clone != parent
    opened = client.get_run(clone)
    assert opened.info.status == "RUNNING" and opened.data.tags["fourm.kfp_run_id"] == "kfp-clone-5678"
    assert opened.data.tags["fourm.declined_parent_run_id"] == parent
    assert opened.data.tags["fourm.run_label"] == "retrain-1-kfp-clon"
    close_lineage_step("retrain-1", "kfp-clone-5678", tracking, parent, "SUCCEEDED")
    assert client.get_run(clone).info.status == "FINISHED"
    assert client.get_run(parent).info.status == ("FINISHED" if original_followed else "RUNNING")
    close_lineage_step("retrain-1", "kfp-original", tracking, parent, "SUCCEEDED")  # the original's exit handler
    assert client.get_run(parent).info.status == ("FINISHED" if original_followed else "RUNNING")


def test_bad_config_fails_the_first_step():
    with pytest.raises(ConfigError, match="data.image_size"):
        open_lineage_step("", "kfp-1", "smoke", ["data.image_size=huge"], "/x", "none", "")


def test_pretrain_config_overrides_touch_only_what_no_upstream_stage_reads():
    from fourm_kfp.config.schema import ConfigError
    from fourm_kfp.launchers.kfp_steps import with_stage_overrides

    assert with_stage_overrides(["data.image_size=32"], ["train.steps=3", "evaluate.num_samples=4"]) == \
        ["data.image_size=32", "train.steps=3", "evaluate.num_samples=4"]
    with pytest.raises(ConfigError, match=r"pretrain_config_overrides \['data.image_size=96'\]"):
        with_stage_overrides([], ["train.steps=3", "data.image_size=96"])  # would move prepare-data's address


def test_a_stage_metric_that_is_not_finite_stays_out_of_the_kfp_metrics_artifact(capsys):
    """KFP cannot serialise NaN into an artifact's metadata (a whole local run failed on a short pretrain's
    throughput); such a value stays in the manifest only, the finite ones are published."""
    from google.protobuf import json_format, struct_pb2
    from kfp import dsl

    from fourm_kfp.contract.runner import StageOutcome
    from fourm_kfp.launchers.kfp_steps import publish_outcome

    metrics = dsl.Metrics(name="metrics", uri="", metadata={})
    outcome = StageOutcome("pretrain", "ran", "/tmp/out", 1.0, "sha256:0",
                           metrics={"steps": 20.0, "tokens_per_s": float("nan"), "mfu": float("inf")})
    publish_outcome(outcome, metrics=metrics)
    assert metrics.metadata == {"steps": 20.0}
    struct = struct_pb2.Struct()
    struct.update(metrics.metadata)
    json_format.MessageToJson(struct)  # what kfp.local does with it; NaN raises here
    assert '"tokens_per_s": NaN' in capsys.readouterr().out  # the outcome itself still says it


def test_a_forced_fan_out_stage_is_recomputed_by_its_workers_and_only_committed_by_its_collect_step(tmp_path,
                                                                                                   monkeypatch):
    """prepare-data at width 2 through the functions its steps call, in the pipeline's order. Forced, its fan-out step
    clears the committed output once; each worker then recomputes its own part (none finds the old manifest and
    skips, none clears what the other wrote); the collect step computes no part and commits the same bytes, at the
    same address, as the unforced run."""
    from fourm_kfp.contract import runner
    from fourm_kfp.stages import prepare_data as body

    step = {"name": ""}
    computed: list[tuple[str, int]] = []  # (step, part) of every part computed
    cleared: list[str] = []  # the step of every clear of a stage's output
    run_part, clear_output = body.run_part, runner.clear_output

    def counted_run_part(ctx, part: int, parts: int):
        computed.append((step["name"], part))
        return run_part(ctx, part, parts)

    def counted_clear_output(stage: str, output) -> int:
        cleared.append(step["name"])
        return clear_output(stage, output)

    monkeypatch.setattr(body, "run_part", counted_run_part)
    monkeypatch.setattr(runner, "clear_output", counted_clear_output)
    overrides, store_uri = ["prepare_data.samples_per_shard=5"], str(tmp_path / "store")
    run = ("smoke", overrides, store_uri, "", "", "")  # preset, overrides, store, S3 endpoint, tracking, parent run

    def prepare_data(force: bool):
        step["name"] = "fan-out"
        items = fan_out_items("prepare-data", 2, *run[:4], force, {"parent_run_id": ""})
        uris = []
        for item in items:
            step["name"] = f"worker {item['part']}"
            uris.append(run_stage_part_component("prepare-data", item["part"], len(items), *run))
        step["name"] = "collect"
        return run_stage_component("prepare-data", *run, force=False, parts=len(items), part_uris=uris)

    first = prepare_data(force=False)
    assert first.status == "ran" and computed == [("worker 0", 0), ("worker 1", 1)] and cleared == []
    output = open_store(first.output_uri)
    unforced = json.loads(output.get_bytes(MANIFEST_NAME))
    output.put_bytes("stale/left-over.bin", b"not this run's")  # a forced run leaves nothing of what was there

    computed.clear()
    forced = prepare_data(force=True)
    assert cleared == ["fan-out"]  # once, before the workers: neither a worker nor the collect step clears
    assert computed == [("worker 0", 0), ("worker 1", 1)]  # each worker its own part; the collect step none
    assert forced.status == "ran" and forced.output_uri == first.output_uri
    manifest = json.loads(output.get_bytes(MANIFEST_NAME))
    assert payload_files(manifest) == payload_files(unforced)  # every file, by its sha256
    assert manifest["payload_digest"] == unforced["payload_digest"]
    assert not output.exists("stale/left-over.bin")

    with pytest.raises(ValueError, match="the prepare-data collect step got force"):
        run_stage_component("prepare-data", *run, force=True, parts=2, part_uris=[forced.output_uri] * 2)
    step["name"] = "label fan-out"
    assert fan_out_items("label", 2, *run[:4], True, {}) == [{"part": 0}, {"part": 1}]
    assert cleared == ["fan-out"]  # the label stage is off (no labelers): it has no output to clear


def test_a_job_s_queue_time_counts_against_the_step_s_retry_window():
    """Argo keeps retrying (and keeps a retried launcher pod) only within the step's retry window from the first
    attempt's start; a job may queue for ``queue_timeout_s`` and then run for its deadline (+ the launcher's grace),
    so the three together must fit. A deadline that fits alone is refused once the queue time no longer does."""
    from fourm_kfp.cluster.job_launcher import FollowSettings
    from fourm_kfp.cluster.job_spec import ClusterParams, JobParams
    from fourm_kfp.launchers.kfp_retry import RETRY_WINDOW_S, check_retry_window

    queue_s, grace_s = ClusterParams().queue_timeout_s, int(FollowSettings.grace_s)  # a day (the default); 600 s
    job = JobParams(deadline_s=RETRY_WINDOW_S - grace_s - queue_s)
    check_retry_window("pretrain", job, ClusterParams(queue_timeout_s=queue_s))  # fills the window exactly
    with pytest.raises(ConfigError, match=rf"pretrain_deadline_s={job.deadline_s} \+ queue_timeout_s={queue_s + 1} "
                                          rf"\(\+{grace_s}s\) exceed the step's retry window of {RETRY_WINDOW_S}s"):
        check_retry_window("pretrain", job, ClusterParams(queue_timeout_s=queue_s + 1))
