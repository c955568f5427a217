"""``fourm-kfp ui``: the full MLflow UI on a run folder's store (mlflow-skinny, which the stages use, has none)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fourm_kfp.cli.help_text import add_command


def _add_ui(commands: argparse._SubParsersAction) -> None:
    ui = add_command(
        commands, "ui", cmd_ui, "serve the MLflow UI on a run folder's store (needs the 'ui' extra: make ui)",
        ["fourm-kfp ui --root runs/demo --port 5000"])
    ui.add_argument("--root", default="runs/demo", help="run folder whose mlflow.db to show (default runs/demo)")
    ui.add_argument("--mlflow-tracking-uri", help="a tracking store instead of <root>/mlflow.db")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000, help="port (default 5000)")


def cmd_ui(args: argparse.Namespace) -> int:
    """Serve the full MLflow UI on a run folder's store (its mlflow.db) or on --mlflow-tracking-uri."""
    # exec's the full MLflow's server: mlflow-skinny, which the stages use, has no UI
    import os
    import shutil

    from fourm_kfp.contract import lineage
    from fourm_kfp.errors import UserError
    from fourm_kfp.launchers.stage import local_root

    root = local_root(args.root)
    tracking = args.mlflow_tracking_uri or lineage.default_tracking_uri(root)
    if not args.mlflow_tracking_uri and not (root / "mlflow.db").is_file():
        raise UserError(f"--root {root}: no mlflow.db there; run the pipeline first (make demo) or name the store "
                        "with --mlflow-tracking-uri")
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("mlflow")  # the full package: mlflow-skinny's `mlflow ui` serves no UI ("index.html not found")
    except PackageNotFoundError:
        raise UserError("the MLflow UI needs the full mlflow package: make ui (or pip install -e '.[ui]')") from None
    exe = Path(sys.executable).parent / "mlflow"
    argv, env = ui_server_command(str(exe) if exe.exists() else shutil.which("mlflow") or "mlflow", tracking,
                                  args.host, args.port)
    address = f"http://{args.host}:{args.port}/"
    print(f"MLflow UI on {address} for {tracking} (Ctrl-C stops it)", flush=True)
    print(f"runs:                {address}{lineage.experiment_page(tracking)}", flush=True)
    latest = lineage.latest_pipeline_run(tracking)
    if latest:
        print(f"newest pipeline run: {address}{lineage.run_page(tracking, latest)}", flush=True)
    os.execve(argv[0], argv, env)
    return 0  # not reached


def ui_server_command(mlflow: str, tracking: str, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The MLflow server's command and environment for one person's browser: one web worker (MLflow's default
    starts four) and no background job consumers (MLflow 3 starts several for GenAI jobs this store never has)."""
    import os

    argv = [mlflow, "ui", "--backend-store-uri", tracking, "--host", host, "--port", str(port), "--workers", "1"]
    return argv, {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


#: This group's commands, in the order ``fourm-kfp --help`` lists them: each adds its subcommand.
COMMANDS = (_add_ui,)
