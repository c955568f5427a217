"""A new SQLite MLflow store starts as a copy of a migrated empty store (fourm_kfp.contract.sqlite_tracking): what
MLflow then holds is what it holds in a store it built itself, and no existing store is ever replaced."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fourm_kfp.contract import lineage
from fourm_kfp.contract.sqlite_tracking import empty_store, prepare_new_store


def _clauses(sql: str | None) -> frozenset[str] | None:
    """A table's or index's SQL as the set of its clauses: MLflow's own migrations list a table's CHECK constraints
    in an order that differs from one build to the next (a set's order in the table copies they make)."""
    return None if sql is None else frozenset(line.strip().rstrip(",").strip() for line in sql.splitlines())


def _contents(db: Path) -> tuple[set, dict]:
    """The schema (every table's and index's clauses) and every table's rows, the experiments' times left out."""
    with sqlite3.connect(db) as conn:
        schema = {(kind, name, _clauses(sql))
                  for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master")}
        tables = [name for kind, name, _ in schema if kind == "table"]
        rows = {}
        for table in tables:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            columns = [c[0] for c in cursor.description]
            timeless = [i for i, c in enumerate(columns) if c not in ("creation_time", "last_update_time")]
            rows[table] = sorted(tuple(row[i] for i in timeless) for row in cursor)
    return schema, rows


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fourm-kfp"


def test_a_store_started_from_the_template_is_the_store_mlflow_builds(tmp_path, cache, monkeypatch):
    for name in ("built", "copied", "elsewhere"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    empty_store()  # made in another folder: a Default experiment left in it would point there
    monkeypatch.chdir(tmp_path)  # the Default experiment's artifact folder is under the current directory
    built, copied = tmp_path / "built" / "mlflow.db", tmp_path / "copied" / "mlflow.db"
    MlflowClient(f"sqlite:///{built}").search_experiments()  # MLflow's own: every migration
    client = lineage._client(f"sqlite:///{copied}")
    assert list(cache.glob("mlflow-*-empty.db")), "the template was not kept"
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert _contents(copied) == _contents(built)
    # and it is a working store: an experiment and a run in each get the same ids
    for db in (built, copied):
        other = MlflowClient(f"sqlite:///{db}")
        assert other.create_experiment("x") == "1"
        assert other.get_experiment("0").artifact_location == str(tmp_path / "mlruns" / "0")


def test_an_existing_store_is_never_replaced(tmp_path, cache):
    store = tmp_path / "mlflow.db"
    MlflowClient(f"sqlite:///{store}").create_experiment("kept")
    before = store.read_bytes()
    empty_store()  # a template is there to copy
    prepare_new_store(f"sqlite:///{store}")
    assert store.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_without_a_writable_cache_mlflow_builds_the_store_itself(tmp_path, monkeypatch):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    client = lineage._client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [e.name for e in client.search_experiments()] == ["Default"]


def test_only_a_new_sqlite_file_in_an_existing_folder_is_prepared(tmp_path, cache):
    prepare_new_store(f"sqlite:///{tmp_path / 'missing-folder' / 'mlflow.db'}")
    prepare_new_store("http://127.0.0.1:5000")
    assert not (tmp_path / "missing-folder").exists() and not cache.exists()
