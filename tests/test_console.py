"""The local run's console: KFP's executor noise stays in the log file; stage lines, progress and errors show."""

from __future__ import annotations

import os
import subprocess
import sys

from fourm_kfp.console import ConsoleLog, LineFilter, closing_summary

KFP_LINES = """\
14:53:02.528 - INFO - Executing task \x1b[96m'prepare-data'\x1b[0m
    [KFP Executor 2026-11-22 14:53:02,614 INFO]: Looking for component `prepare_data` in --component_module_path
        "inputs": {
            "parameterValues": {
    prepare-data train: 16/16 (100%) 86.2 scenes/s, elapsed 0:00:00 ETA 0:00:00
    2026-11-22 14:53:07,628 INFO fourm_kfp.contract.runner: prepare-data: committed /x/_MANIFEST.json (25 files)
    2026-11-22 14:53:07,629 INFO fourm_kfp.data.ingest: reading 3 files
    2026-11-22 14:53:07,680 WARNING fourm_kfp.contract.runner: prepare-data: cleared 3 objects
14:53:08.861 - INFO - Task \x1b[96m'prepare-data'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m
14:53:08.864 - INFO - Executing task 'open-lineage-run'
14:53:08.864 - INFO - Executing task 'train-tokenizers'
    fourm_kfp.data.ingest.TooManyBadSamplesError: source /p: 3 of 5 samples could not be used
14:53:09.000 - ERROR - Task 'train-tokenizers' finished with status FAILURE
"""


def test_line_filter_keeps_stages_progress_warnings_and_the_error():
    ticks = iter(range(100))
    f = LineFilter(lambda: float(next(ticks)))
    shown = [s for line in KFP_LINES.splitlines() if (s := f(line)) is not None]
    assert shown == [
        "▶ prepare-data",
        "  prepare-data train: 16/16 (100%) 86.2 scenes/s, elapsed 0:00:00 ETA 0:00:00",
        "  prepare-data: committed /x/_MANIFEST.json (25 files)",
        "  warning: prepare-data: cleared 3 objects",
        "✓ prepare-data (1.0s)",
        "▶ train-tokenizers",
        "✗ train-tokenizers failed after 1.0s: TooManyBadSamplesError: source /p: 3 of 5 samples could not be used",
    ]


def test_console_log_sends_subprocess_output_to_the_file(tmp_path, capfd):
    log = tmp_path / "logs" / "run.log"
    with ConsoleLog(log) as console:
        console.print("hello console")
        subprocess.run([sys.executable, "-c", "print('executor json noise'); "
                        "print('stage x: 5/10 (50%) 1.0 it/s, elapsed 0:00:05 ETA 0:00:05')"], check=True)
        os.write(1, b"more noise\n")
    out = capfd.readouterr().out
    assert "hello console" in out and "ETA 0:00:05" in out and "noise" not in out
    text = log.read_text()
    assert "executor json noise" in text and "more noise" in text


def test_closing_summary_names_every_stage_and_where_things_are():
    summary = {"mlflow": {"tracking_uri": "sqlite:////r/mlflow.db", "parent_run_id": "abc",
                          "parent_run_page": "#/experiments/1/runs/abc"}, "kfp_log": "/r/l.log",
               "stages": [{"name": "prepare-data", "status": "skipped", "seconds": 1.25, "output_uri": "/r/p/1"}]}
    text = closing_summary(summary)
    assert "prepare-data  skipped" in text and "/r/p/1" in text and "/r/l.log" in text
    # `fourm-kfp ui` works for any root, in or out of a checkout (`make ui` only installs the extra), and the
    # closing lines point at this run's page, not the UI's front page
    assert "fourm-kfp ui --root /r " in text and "make ui DEMO_ROOT" not in text
    assert "http://127.0.0.1:5000/#/experiments/1/runs/abc" in text


def test_closing_summary_says_why_a_model_is_the_champion_and_links_it():
    summary = {"mlflow": {"tracking_uri": "sqlite:////r/mlflow.db", "parent_run_id": "abc",
                          "parent_run_page": "#/experiments/1/runs/abc?workflowType=machine_learning",
                          "model_page": "#/models/fourm-demo/versions/1?workflowType=machine_learning"},
               "stages": [{"name": "evaluate", "status": "ran", "seconds": 1.0, "output_uri": "/r/e/1"}],
               "model_gate": {"model_name": "fourm-demo", "version": "1", "promoted": True,
                              "reason": "there was no champion, so this version became the champion (val.loss 4.9)"}}
    lines = closing_summary(summary).splitlines()
    model = next(line for line in lines if line.startswith("model:"))
    assert model == ("model:      fourm-demo version 1 in the MLflow registry (champion): there was no champion, so "
                     "this version became the champion (val.loss 4.9)")
    assert "            http://127.0.0.1:5000/#/models/fourm-demo/versions/1?workflowType=machine_learning  " \
           "(the registered model)" in lines
    summary["model_gate"].update(version="2", promoted=False, reason="val.loss 5.0 does not beat champion v1")
    model = next(line for line in closing_summary(summary).splitlines() if line.startswith("model:"))
    assert "version 2 in the MLflow registry (candidate; the champion stays): val.loss 5.0 does not" in model


def test_closing_summary_prints_the_run_time_beside_the_machines_matmul_rate():
    summary = {"mlflow": {"tracking_uri": "sqlite:////r/mlflow.db", "parent_run_id": "abc"}, "seconds": 321.04,
               "machine": {"fp32_matmul_gflops": 231.4, "threads": 2},
               "stages": [{"name": "pretrain", "status": "ran", "seconds": 300.0, "output_uri": "/r/t/1"}]}
    total = next(line for line in closing_summary(summary).splitlines() if line.startswith("total"))
    assert "321.0" in total and "231 GFLOP/s" in total and "2 threads" in total and "bf16" not in total
    summary["machine"]["bf16_matmul_gflops"] = 430.2  # a CPU with bf16 arithmetic
    total = next(line for line in closing_summary(summary).splitlines() if line.startswith("total"))
    assert "231 GFLOP/s of fp32 matmul (430 of bf16, which precision auto uses there) on 2 threads" in total
