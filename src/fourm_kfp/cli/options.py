"""The options several ``fourm-kfp`` commands share (the preset and its overrides; the run folder and the stores),
and the reading of their ``KEY=VALUE`` arguments."""

from __future__ import annotations

import argparse


def add_config_options(p: argparse.ArgumentParser) -> None:
    """``--preset`` and ``--set``: the config a command works on."""
    from fourm_kfp.config.loader import available_presets

    p.add_argument("--preset", default="smoke",
                   help=f"named config preset ({', '.join(available_presets())}); default smoke")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set data.image_size=96")


def add_store_options(p: argparse.ArgumentParser) -> None:
    """``--root``, ``--store``, ``--s3-endpoint``, ``--mlflow-tracking-uri``: where a run's outputs and lineage go."""
    p.add_argument("--root", required=True, help="local run folder: MLflow store (mlflow.db), KFP pipeline root, "
                   "and the default output store")
    p.add_argument("--store", help="root URI of stage outputs (default: --root, or s3://fourm-kfp with --s3-endpoint)")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL); credentials come from "
                   "$AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY")
    p.add_argument("--mlflow-tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///<root>/mlflow.db")


#: The options of a command on a run folder: the config and where its outputs and lineage are.
RUN_OPTIONS = (add_config_options, add_store_options)


def pairs(items: list[str], flag: str, shape: str = "KEY=VALUE", empty_ok: bool = False) -> dict[str, str]:
    """``--flag KEY=VALUE`` arguments as a dict; a malformed one is a user error naming the flag."""
    from fourm_kfp.config.schema import ConfigError

    found = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not (value or empty_ok):
            raise ConfigError(f"{flag} {item!r}: expected {shape}")
        found[key] = value
    return found
