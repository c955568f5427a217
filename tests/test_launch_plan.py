"""A launch on other machines plans first; when the plan finds the output committed, reporting it uses what the plan
loaded (config, store, manifest) and loads, opens and reads nothing again (``launchers.stage``)."""

from __future__ import annotations

import pytest

import fourm_kfp.config.loader as config_loader
import fourm_kfp.contract.runner as runner
from fourm_kfp.launchers.stage import RunContext, launch_stage, plan_launch


def test_a_committed_plan_is_reported_without_loading_or_reading_again(tmp_path, monkeypatch):
    run = RunContext("smoke", store_uri=str(tmp_path / "store"), tracking_uri="none")
    assert plan_launch("prepare-data", run).committed is None  # nothing there yet
    ran = launch_stage("prepare-data", run)
    plan = plan_launch("prepare-data", run)
    assert plan.committed is not None and plan.committed[1] == ran.manifest_digest

    def refuse(*args, **kwargs):
        raise AssertionError("loaded or read again after the plan")

    monkeypatch.setattr(config_loader, "load_config", refuse)
    monkeypatch.setattr(runner, "read_manifest", refuse)
    reported = launch_stage("prepare-data", run, plan=plan)
    assert (reported.status, reported.output_uri, reported.manifest_digest) == ("skipped", ran.output_uri,
                                                                               ran.manifest_digest)
    with pytest.raises(ValueError, match="a plan of stage 'prepare-data' handed to stage 'pretokenize'"):
        launch_stage("pretokenize", run, plan=plan)
