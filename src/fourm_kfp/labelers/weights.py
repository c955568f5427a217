"""Where a labeler's weights come from, and the digest of them that goes into the label stage's content address.

A labeler says what its weights are (:attr:`fourm_kfp.labelers.base.Labeler.weights_kind`), and its config entry's
``weights`` names them:

==========  ===================================================  ==================================================
kind        ``weights``                                          digest (in the address)
==========  ===================================================  ==================================================
``file``    one file: a local path or ``s3://`` URI (a           ``sha256:`` of the file
            plug-in's checkpoint)
``folder``  a model folder as transformers' ``save_pretrained``  ``sha256:`` over every file's relative path and
            writes it: a local folder, an ``s3://`` prefix, or    sha256; for ``s3://``: ``s3-etags:`` over each
            ``hf://<repo>@<40-hex commit>``                       object's key, size and ETag, from the listing;
                                                                 for ``hf://``: ``hf:<repo>@<commit>``
``model``   a committed pretrain output of this pipeline         its manifest's payload digest
==========  ===================================================  ==================================================

Every step of a run computes the label stage's address, so a folder's digest costs no download: a local folder's
file digests are remembered by path, size, inode, and modification and change times (a same-size rewrite that keeps
the old modification time, as ``cp -p``, ``rsync -t`` or ``tar x`` leave one, still moves the change time, which no
tool can set); an ``s3://`` folder's come from its listing; an ``hf://`` folder's is its commit. Every remote source
is copied to a local cache once per worker (``FOURM_LABELER_CACHE``, else a folder under the system's temp dir) and
read from there: an ``s3://`` file again only when its version (size, ETag, time) changed, an ``s3://`` folder only
when its digest did (the copy is made anew, so a file deleted upstream leaves the cache too). An ``hf://`` folder
lives in ``huggingface_hub``'s own cache layout (``models--<org>--<name>/snapshots/<commit>/``) in
:func:`hf_cache_dir`: ``$FOURM_LABELER_CACHE/hf`` when that is set (it keeps precedence), else ``$HF_HUB_CACHE``,
else ``$HF_HOME/hub`` (so a PVC mounted there serves every pod), else the temp folder's ``hf``. A pinned commit
already there is read from there without asking the hub; else only the files a transformers folder needs
(:data:`HF_FILES`) are fetched, and never with ``HF_HUB_OFFLINE`` set, which then reads the cache alone. A local
model folder that is missing but names a ``source`` commit that the cache holds is read from the cache (the same
files, so the same digest). An ``hf://`` address must pin a commit: a branch or tag name is refused, because labels
must not move under a fixed address. Nothing is fetched that the config does not name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from fourm_kfp.labelers.base import LabelerError
from fourm_kfp.storage import file_store, is_s3_uri, open_store

#: The address form of a folder on the Hugging Face hub, pinned to one commit.
HF_PREFIX = "hf://"
_HF_URI = re.compile(r"hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)@(?P<commit>[0-9a-f]{40})")
#: What is fetched of a hub folder: configs, tokenizer files, and the PyTorch weights: safetensors, and the older
#: ``pytorch_model*.bin`` that some repositories hold instead (transformers reads safetensors when both are there,
#: and a ``.bin`` only with ``weights_only`` unpickling); never other frameworks' weights.
HF_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.safetensors", "pytorch_model*.bin")


def cache_dir() -> Path:
    """The local cache of remote weights (``FOURM_LABELER_CACHE``, else under the system's temp dir)."""
    return Path(os.environ.get("FOURM_LABELER_CACHE") or Path(tempfile.gettempdir()) / "fourm-kfp-labeler-weights")


def hf_cache_dir() -> Path:
    """Where hub folders are cached, in huggingface_hub's layout: ``$FOURM_LABELER_CACHE/hf`` if set, else
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else :func:`cache_dir`'s ``hf``."""
    if os.environ.get("FOURM_LABELER_CACHE"):
        return cache_dir() / "hf"
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return cache_dir() / "hf"


def _hf_cache_named() -> bool:
    """Whether the environment names a Hugging Face cache (``HF_HUB_CACHE`` or ``HF_HOME``)."""
    return bool(os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME"))


def file_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _remembered_digest(path: Path) -> str:
    """:func:`file_digest` of a local file, remembered in the cache by its path, size, inode, and modification and
    change times (see the module docstring)."""
    stat = path.stat()
    memo = cache_dir() / "digests" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24] + ".json")
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino}
    try:
        known = json.loads(memo.read_text())
        if {k: known.get(k) for k in stamp} == stamp:
            return known["digest"]
    except (OSError, ValueError, KeyError):
        pass
    digest = file_digest(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**stamp, "digest": digest}))
    os.replace(tmp, memo)
    return digest


def folder_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a folder: over each file's path relative to it and its own digest, in path order (a
    renamed, added, removed or changed file changes it; the folder's own place and the files' times do not)."""
    root = Path(path)
    listing = [(p.relative_to(root).as_posix(), _remembered_digest(p)) for p in sorted(root.rglob("*"))
               if p.is_file()]
    return "sha256:" + hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def s3_folder_digest(uri: str, where: str) -> str:
    """``s3-etags:<hex>`` of an ``s3://`` folder: over each object's key, size and ETag, from its listing (no
    download); an empty or missing folder is an error naming ``where``."""
    listing = open_store(uri).list_etags()
    if not listing:
        raise LabelerError(f"{where}: weights folder {uri} does not exist or is empty")
    return "s3-etags:" + hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def _cached(uri: str) -> Path:
    return cache_dir() / hashlib.sha256(uri.encode()).hexdigest()[:16]


def fetch_file(uri: str, where: str) -> tuple[str, str]:
    """``(local path, digest)`` of the weights file at ``uri`` (a local path or ``s3://``)."""
    if not uri:
        raise LabelerError(f"{where}: this labeler needs weights; set its 'weights' to a local path or s3:// URI")
    if is_s3_uri(uri):
        store, name = file_store(uri)
        if not name or not store.exists(name):
            raise LabelerError(f"{where}: weights file {uri} does not exist")
        target = _cached(uri) / name
        stamp, version = target.with_name(name + ".version"), store.version(name)
        if not target.exists() or not stamp.exists() or stamp.read_text() != version:
            target.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(name, target)
            stamp.write_text(version)
        return str(target), file_digest(target)
    path = Path(uri).expanduser()
    if not path.is_file():
        raise LabelerError(f"{where}: weights file {uri} does not exist")
    return str(path), file_digest(path)


def parse_hf_uri(uri: str, where: str) -> tuple[str, str]:
    """``(repo, commit)`` of ``hf://<repo>@<40-hex commit>``; anything else (a branch, a tag, a short hash, no
    revision) is an error naming ``where``."""
    match = _HF_URI.fullmatch(uri)
    if match is None:
        raise LabelerError(f"{where}: {uri!r} is not hf://<owner>/<repo>@<commit>, with the full 40-hex commit: a "
                           "branch or tag name can move, and the labels must not move under a fixed address")
    return match["repo"], match["commit"]


def _hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def cached_snapshot(uri: str, where: str) -> str | None:
    """The folder of the pinned hub commit ``uri`` in :func:`hf_cache_dir` (huggingface_hub's own look-up, which
    never asks the hub and refuses a snapshot its cached listing shows incomplete), or None when it is not there."""
    repo, commit = parse_hf_uri(uri, where)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return snapshot_download(repo, revision=commit, cache_dir=hf_cache_dir(), allow_patterns=list(HF_FILES),
                                 local_files_only=True)
    except LocalEntryNotFoundError:
        return None


def _fetch_hf(uri: str, where: str) -> str:
    repo, commit = parse_hf_uri(uri, where)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise LabelerError(f"{where}: {uri} needs huggingface_hub: pip install 'fourm-kfp[teachers]'") from exc
    cached = cached_snapshot(uri, where)
    if cached is not None:
        return cached
    offline = _hf_offline()
    try:
        return snapshot_download(repo, revision=commit, cache_dir=hf_cache_dir(), allow_patterns=list(HF_FILES),
                                 local_files_only=offline)
    except LocalEntryNotFoundError as exc:
        how = "HF_HUB_OFFLINE is set and the cache lacks it" if offline else "the hub cannot be reached"
        raise LabelerError(f"{where}: {uri} is not in the weights cache {hf_cache_dir()} and {how}: fetch it "
                           f"there once where the hub is reachable, or copy the folder and name it instead") from exc
    except Exception as exc:  # noqa: BLE001 - the hub's many error types: name the address
        raise LabelerError(f"{where}: cannot fetch {uri}: {type(exc).__name__}: {exc}") from exc


def _fetch_s3_folder(uri: str, digest: str) -> str:
    """The local copy of the ``s3://`` folder ``uri``, fetched again only when its listing's ``digest``
    (:func:`s3_folder_digest`) is not the one the copy was made at."""
    store = open_store(uri)
    target = _cached(uri) / "folder"
    stamp = target.with_name("folder.versions.json")
    if not target.is_dir() or not stamp.exists() or stamp.read_text() != digest:
        stamp.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)  # no file of an older version stays behind
        for key in store.list():
            (target / key).parent.mkdir(parents=True, exist_ok=True)
            store.get_file(key, target / key)
        stamp.write_text(digest)
    return str(target)


def fetch_folder(uri: str, where: str) -> tuple[str, str]:
    """``(local folder, digest)`` of the model folder ``uri`` (a local folder, an ``s3://`` prefix or
    ``hf://<repo>@<commit>``; see the module docstring)."""
    if not uri:
        raise LabelerError(f"{where}: this labeler needs a model folder; set its 'weights' to a local folder, an "
                           "s3:// prefix or hf://<repo>@<commit>")
    if uri.startswith(HF_PREFIX):
        return _fetch_hf(uri, where), folder_weights_digest(uri, where)
    if is_s3_uri(uri):
        digest = s3_folder_digest(uri, where)
        return _fetch_s3_folder(uri, digest), digest
    path = Path(uri).expanduser()
    if not path.is_dir():
        raise LabelerError(f"{where}: weights folder {uri} does not exist")
    return str(path), folder_digest(path)


def fetch_command(source: str, folder: str, where: str) -> str:
    """The one command that fetches the hub folder ``source`` (``hf://<repo>@<commit>``): the ``hf`` CLI that
    huggingface_hub installs, at that commit, only the files a transformers folder needs; into the Hugging Face
    cache (:func:`hf_cache_dir`) when the environment names one (``HF_HUB_CACHE``, ``HF_HOME``), where
    :func:`folder_to_read` finds it, else into ``folder``."""
    repo, commit = parse_hf_uri(source, where)
    include = " ".join(f"--include '{pattern}'" for pattern in HF_FILES)
    into = f"--cache-dir {hf_cache_dir()}" if _hf_cache_named() else f"--local-dir {folder}"
    return f"hf download {repo} --revision {commit} {include} {into}"


def folder_to_read(uri: str, source: str, where: str) -> str:
    """The model folder weights ``uri`` to read: ``uri`` itself unless it is a local folder that does not exist;
    then the ``source`` commit's folder in the Hugging Face cache (:func:`cached_snapshot`) if it is there, else an
    error naming ``where`` that gives the command that fetches it (:func:`fetch_command`)."""
    if not uri or is_s3_uri(uri) or uri.startswith(HF_PREFIX) or Path(uri).expanduser().is_dir():
        return uri
    cached = cached_snapshot(source, f"{where}.source") if source else None
    if cached is not None:
        return cached
    how = (f"; fetch it with:\n  {fetch_command(source, uri, where)}" if source
           else "; set it to a model folder, an s3:// prefix or hf://<repo>@<commit>")
    raise LabelerError(f"{where}.weights: the model folder {uri} does not exist{how}")


def check_local_folder(uri: str, source: str, where: str) -> None:
    """Fail as :func:`folder_to_read` does when the model folder ``uri`` is neither there nor in the cache."""
    folder_to_read(uri, source, where)


def folder_weights_digest(uri: str, where: str) -> str:
    """The digest of a model folder without fetching it (see the module docstring): :func:`fetch_folder`'s."""
    if uri.startswith(HF_PREFIX):
        repo, commit = parse_hf_uri(uri, where)
        return f"hf:{repo}@{commit}"
    if is_s3_uri(uri):
        return s3_folder_digest(uri, where)
    return fetch_folder(uri, where)[1]


def model_weights(uri: str, where: str) -> tuple[str, str]:
    """``(URI, digest)`` of a committed pretrain output used as weights (a teacher that is one of our models): its
    manifest's payload digest, which changes with any of its files."""
    from fourm_kfp.contract.manifest import read_manifest

    if not uri:
        raise LabelerError(f"{where}: this labeler needs a model; set its 'weights' to a pretrain output's URI")
    found = read_manifest(open_store(uri))
    if found is None:
        raise LabelerError(f"{where}: no committed model at {uri} (no _MANIFEST.json: run its pipeline first)")
    return uri, found[0]["payload_digest"]


_FETCH = {"file": fetch_file, "folder": fetch_folder, "model": model_weights}


def resolve_weights(kind: str, uri: str, where: str) -> tuple[str, str]:
    """``(local path or URI to read, digest)`` of weights of ``kind`` named ``uri`` (fetched into the cache)."""
    return _FETCH[kind](uri, where)


def weights_digest(kind: str, uri: str, where: str) -> str:
    """What the label stage's address covers of the weights: :func:`resolve_weights`'s digest, without a download
    where the address alone names the bytes."""
    if kind == "folder":
        return folder_weights_digest(uri, where)
    return resolve_weights(kind, uri, where)[1]
