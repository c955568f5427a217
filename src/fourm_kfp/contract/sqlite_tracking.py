"""A new local MLflow store (``sqlite:///<file>``) starts as a copy of an empty store already migrated.

MLflow builds a new SQLite store by running every schema migration in turn (some 60 alembic revisions, many of them
copying a table): about 2 s on 2 cores, paid by the first process of every new run folder and by every tool or test
that opens a store of its own. The first time on a machine, :func:`prepare_new_store` has MLflow build one, deletes
the Default experiment MLflow adds to it, and keeps it in the user's cache folder under the MLflow version (which
fixes the schema's head revision). A new store is then a copy of it: MLflow finds every table at the head revision,
runs no migration, and creates the Default experiment itself (its artifact folder under the current directory, its
creation time now), as it does in any new store. Where the cache folder cannot be written, MLflow builds the store as
usual."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

SQLITE_PREFIX = "sqlite:///"


def template_folder() -> Path:
    """``$XDG_CACHE_HOME/fourm-kfp`` (default ``~/.cache/fourm-kfp``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "fourm-kfp"


def prepare_new_store(tracking_uri: str) -> None:
    """Where ``tracking_uri`` names a SQLite file that does not exist yet in a folder that does, put a copy of the
    migrated empty store there (:func:`empty_store`); anything else is left to MLflow. A store another process creates
    meanwhile is kept: the copy never replaces a file."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return
    path = Path(tracking_uri.removeprefix(SQLITE_PREFIX))
    if path.exists() or not path.parent.is_dir():
        return
    try:
        template = empty_store()
    except (OSError, RuntimeError) as err:  # no home, an unwritable cache folder: MLflow migrates the store itself
        log.debug("no migrated MLflow store template (%s); MLflow builds %s", err, path)
        return
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    try:
        shutil.copyfile(template, partial)
        os.link(partial, path)  # never over a store that appeared meanwhile
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)


def empty_store() -> Path:
    """The migrated empty store of this MLflow version, built on first use (by whichever process gets there first;
    a concurrent builder's copy is the same)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    folder = template_folder()
    template = folder / f"mlflow-{mlflow.__version__}-empty.db"
    if template.is_file():
        return template
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{template.name}.{uuid.uuid4().hex}.part"
    try:
        logging.getLogger("alembic").setLevel(logging.WARNING)
        MlflowClient(tracking_uri=f"{SQLITE_PREFIX}{partial}").search_experiments()  # every migration, once
        with sqlite3.connect(partial) as db:
            db.execute("DELETE FROM experiments")  # MLflow creates the Default experiment in each copy
        partial.replace(template)
    finally:
        partial.unlink(missing_ok=True)
    return template
