"""Real-data sources for ``prepare-data``: a folder of images, or an image-text WebDataset as img2dataset writes it.

Each source is an iterator of :class:`SourceItem` in a deterministic order (sorted keys / tar names): either a
sample ``{"rgb": uint8 [S, S, 3], "caption": str}`` (``caption`` absent when there is none) with the image's
original size before the centre crop, or a skip record carrying a :class:`BadSampleError`. The caller counts skips
with :class:`SkipCounter` and fails the stage when there are too many.

A worker that takes a share of a source reads the same pieces: :class:`ImageFolder` lists a folder's images with
their keys (from the listing alone) and loads any one of them; :func:`webdataset_tars` lists a WebDataset's tars
and :func:`iter_webdataset_tar` reads one.

Skip reasons: ``unreadable``, ``truncated``, ``too_small``, ``decompression_bomb`` (from
:func:`normalize_image`); ``bad_caption_encoding`` (a caption that is not UTF-8); ``missing_image`` (a
WebDataset sample without an image member); ``bad_metadata`` (a WebDataset ``.json`` that is not a JSON object,
read only when there is no ``.txt`` caption); ``corrupt_tar`` (one record for the unread rest of a tar that is
damaged or ends early).

Captions: an empty or whitespace-only caption counts as no caption (the image is kept). An image folder takes
its captions from ``captions_file`` when one is given (JSONL or CSV, see :func:`read_captions_file`), else from
``<stem>.txt`` next to each image. Files whose name starts with ``.`` (``.DS_Store``, macOS ``._x.jpg``) are
ignored.

Keys are ``[A-Za-z0-9_-]``: a name that had to be changed (``/``, spaces, dots, over 64 characters) gets a hash
of the name as suffix, and a name already taken (``x.jpg`` next to ``x.png``) a hash of its origin, so keys are
unique and the same for the same input on every run.

Over 400 lines and one concern: reading external image data into samples, with the skip rules and keys the two
source layouts share; the source records (:mod:`fourm_kfp.data.sources`) plan and fingerprint them.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import logging
import re
import tarfile
import zlib
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

from fourm_kfp.data.image_normalize import DEFAULT_MIN_SIDE, BadSampleError, normalize_image_sized
from fourm_kfp.errors import UserError
from fourm_kfp.storage import Store, file_store

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
#: WebDataset image members, in order of preference when a sample has several.
WDS_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
FILE_COLUMNS = ("file", "image", "path")
CAPTION_COLUMNS = ("caption", "text")
MAX_KEY_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: webdataset's split of a member name: the key is the path up to the first dot of the basename.
_WDS_MEMBER = re.compile(r"^((?:.*/|)[^./][^.]*)\.([^/]*)$")


@dataclass(frozen=True)
class SourceItem:
    """One sample of a source, or the record of one that was skipped (exactly one of ``sample``/``skipped``)."""

    key: str
    sample: dict[str, Any] | None
    skipped: BadSampleError | None
    origin: str
    #: the image's ``(width, height)`` before the centre crop (upright, after its EXIF orientation); with a sample
    original_size: tuple[int, int] | None = None


class TooManyBadSamplesError(UserError, RuntimeError):
    """More of the source was unusable than ``prepare_data.max_bad_fraction`` allows."""


class SkipCounter:
    """Skipped samples counted by reason, remembering the first ``keep`` of them for error messages."""

    def __init__(self, keep: int = 10):
        self.keep = keep
        self.by_reason: Counter[str] = Counter()
        self.first: list[BadSampleError] = []

    def add(self, err: BadSampleError) -> None:
        self.by_reason[err.reason] += 1
        if len(self.first) < self.keep:
            self.first.append(err)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_reason": dict(sorted(self.by_reason.items())),
            "first": [{"origin": e.name, "reason": e.reason, "detail": e.detail} for e in self.first],
        }

    def merge(self, counts: dict[str, Any]) -> None:
        """Add another counter's skips (its :meth:`as_dict`): reasons summed, its first bad samples after ours."""
        self.by_reason.update(counts["by_reason"])
        for first in counts["first"][:max(self.keep - len(self.first), 0)]:
            self.first.append(BadSampleError(first["reason"], first["origin"], first["detail"]))

    def check(self, total_seen: int, max_bad_fraction: float, where: str) -> None:
        """Raise :class:`TooManyBadSamplesError` when skipped / ``total_seen`` exceeds ``max_bad_fraction``."""
        fraction = self.total / total_seen if total_seen else 0.0
        if fraction <= max_bad_fraction:
            return
        reasons = ", ".join(f"{reason}={n}" for reason, n in sorted(self.by_reason.items()))
        examples = "; ".join(str(err) for err in self.first[:3])
        raise TooManyBadSamplesError(
            f"{where}: {self.total} of {total_seen} samples ({fraction:.2%}) could not be used, more than "
            f"prepare_data.max_bad_fraction={max_bad_fraction:g} allows ({reasons}). First bad samples: {examples}. "
            "Fix or remove these files, or raise prepare_data.max_bad_fraction.")


class _Keys:
    """Stable, unique, filename-safe sample keys (see the module docstring)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def __call__(self, name: str, origin: str) -> str:
        base = _UNSAFE.sub("_", name).strip("_")[:MAX_KEY_CHARS] or "sample"
        key = base if base == name else f"{base}-{_short_hash(name)}"
        if key in self.taken:
            key = f"{base}-{_short_hash(origin)}"
        if key in self.taken:
            raise ValueError(f"two samples map to the same key {key!r}; the second is {origin}")
        self.taken.add(key)
        return key


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:10]


def _caption(data: bytes, origin: str) -> str | None:
    """UTF-8 caption bytes → the stripped text, ``None`` when empty; :class:`BadSampleError` when not UTF-8."""
    try:
        text = data.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        raise BadSampleError("bad_caption_encoding", origin, f"caption is not UTF-8: {exc}") from exc
    return text or None


def _hidden(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith(".")


# ---------------------------------------------------------------------------------------------- image folders


@dataclass(frozen=True)
class FolderEntry:
    """One image of an image folder: its path in the store, its path without the extension, and its key."""

    path: str
    stem: str
    key: str


class ImageFolder:
    """An image folder as a source: every image under ``store`` (recursively, sorted by path) with its key, known
    from the listing alone (:attr:`entries`), and :meth:`load` to read one, with its caption where it has one."""

    def __init__(self, store: Store, image_size: int, captions_file: str | None = None,
                 min_side: int = DEFAULT_MIN_SIDE, include: tuple[str, ...] = ()):
        self.store, self.image_size, self.min_side = store, image_size, min_side
        listing = store.list()
        self.present = set(listing)
        #: ``{image path: caption}`` from ``captions_file``; ``None`` without one (``<stem>.txt`` files then)
        self.captions = read_captions_file(store, captions_file) if captions_file else None
        unmatched = sorted(set(self.captions or ()) - self.present)
        if unmatched:
            log.warning("%s: %d captioned files are not in %s, e.g. %s", captions_file, len(unmatched), store.uri,
                        unmatched[:3])
        make_key = _Keys()
        self.entries: list[FolderEntry] = []
        for path in listing:
            stem, dot, ext = path.rpartition(".")
            if dot and f".{ext.lower()}" in IMAGE_EXTENSIONS and not _hidden(path) and included(path, include):
                self.entries.append(FolderEntry(path, stem, make_key(stem, store.uri_of(path))))

    def load(self, entry: FolderEntry) -> SourceItem:
        """The image of ``entry`` normalised, with its caption, or the record of why it was skipped."""
        store, origin = self.store, self.store.uri_of(entry.path)
        try:
            rgb, size = normalize_image_sized(store.get_bytes(entry.path), self.image_size, origin, self.min_side)
            if self.captions is not None:
                caption = self.captions.get(entry.path)
            elif f"{entry.stem}.txt" in self.present:
                caption = _caption(store.get_bytes(f"{entry.stem}.txt"), store.uri_of(f"{entry.stem}.txt"))
            else:
                caption = None
        except BadSampleError as err:
            return SourceItem(entry.key, None, err, origin)
        sample: dict[str, Any] = {"rgb": rgb}
        if caption:
            sample["caption"] = caption
        return SourceItem(entry.key, sample, None, origin, size)


def included(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``path`` matches one of the glob ``patterns`` (``prepare_data.include``; none: every path)."""
    return not patterns or any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def iter_image_folder(store: Store, image_size: int, captions_file: str | None = None,
                      min_side: int = DEFAULT_MIN_SIDE, workers: int = 1) -> Iterator[SourceItem]:
    """Every image under ``store`` (recursively, sorted by path), with its caption where it has one.

    ``workers`` threads read and decode ahead (PIL releases the GIL while decoding); the order stays the same.
    """
    folder = ImageFolder(store, image_size, captions_file, min_side)
    yield from ordered_map(folder.load, folder.entries, workers)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads with bounded lookahead, results in input order.

    If iterating ``items`` raises, the results already submitted are still yielded before the error propagates.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    source, pending, error = iter(items), deque(), None
    with ThreadPoolExecutor(workers) as pool:
        try:
            while True:
                try:
                    item = next(source)
                except StopIteration:
                    break
                except Exception as exc:  # the producer failed: hand out what it produced, then re-raise
                    error = exc
                    break
                pending.append(pool.submit(fn, item))
                if len(pending) >= 4 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:  # the consumer stopped early
                future.cancel()
    if error is not None:
        raise error


def read_captions_file(store: Store, ref: str) -> dict[str, str]:
    """A JSONL (``.jsonl``/``.ndjson``/``.json``) or CSV (``.csv``, with a header) file → ``{image path: caption}``.

    ``ref`` is relative to ``store`` or an absolute path / URI. Rows name the image by ``file``, ``image`` or
    ``path`` (relative to the store root) and the caption by ``caption`` or ``text``; empty captions are left
    out. Anything malformed raises ``ValueError`` naming the file and line.
    """
    if ref.startswith("/") or "://" in ref:
        store, ref = file_store(ref)
    origin = store.uri_of(ref)
    data = store.get_bytes(ref)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{origin}:{line}: not UTF-8 text") from None
    suffix = ref.rsplit(".", 1)[-1].lower()
    if suffix in ("jsonl", "ndjson", "json"):
        rows = _jsonl_rows(text, origin)
    elif suffix == "csv":
        rows = _csv_rows(text, origin)
    else:
        raise ValueError(f"{origin}: captions file must be .jsonl, .ndjson, .json or .csv")
    captions: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for line, row in rows:
        file, caption = _field(row, FILE_COLUMNS, origin, line), _field(row, CAPTION_COLUMNS, origin, line)
        if not isinstance(file, str) or not isinstance(caption, str):
            raise ValueError(f"{origin}:{line}: the file and caption must be strings")
        file = file.removeprefix("./").lstrip("/")
        if file in first_line:
            raise ValueError(f"{origin}:{line}: a second caption for {file!r} (first on line {first_line[file]})")
        first_line[file] = line
        if caption.strip():
            captions[file] = caption.strip()
    return captions


def _jsonl_rows(text: str, origin: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{origin}:{line}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{origin}:{line}: expected a JSON object, got {type(row).__name__}")
        yield line, row


def _csv_rows(text: str, origin: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    for names in (FILE_COLUMNS, CAPTION_COLUMNS):
        if not any(n in header for n in names):
            raise ValueError(f"{origin}:1: the header needs a column named {' or '.join(names)}, got {header}")
    for row in reader:
        if None in row or None in row.values():
            raise ValueError(f"{origin}:{reader.line_num}: expected {len(header)} fields "
                             "(put captions with commas in double quotes)")
        yield reader.line_num, row


def _field(row: dict[str, Any], names: tuple[str, ...], origin: str, line: int) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise ValueError(f"{origin}:{line}: missing field, expected one of {', '.join(names)}")


# ------------------------------------------------------------------------------------------------- webdataset


def webdataset_tars(store: Store) -> list[str]:
    """The ``*.tar`` files of a WebDataset under ``store``, sorted by name (hidden files left out)."""
    return [key for key in store.list() if key.lower().endswith(".tar") and not _hidden(key)]


def iter_webdataset(store: Store, image_size: int, min_side: int = DEFAULT_MIN_SIDE,
                    workers: int = 1) -> Iterator[SourceItem]:
    """Every sample of every ``*.tar`` under ``store`` (tars sorted by name, samples in tar order).

    Tars are streamed in order; ``workers`` threads decode the images of samples already read.
    """
    make_key = _Keys()
    for tar_key in webdataset_tars(store):
        yield from iter_webdataset_tar(store, tar_key, image_size, min_side, workers, make_key)


def iter_webdataset_tar(store: Store, tar_key: str, image_size: int, min_side: int = DEFAULT_MIN_SIDE,
                        workers: int = 1, make_key: Callable[[str, str], str] | None = None
                        ) -> Iterator[SourceItem]:
    """Every sample of one tar of a WebDataset, in tar order; a tar that is damaged or ends early gives one
    ``corrupt_tar`` skip record for its unread rest. Keys are unique within the tar, or within every tar read with
    the same ``make_key``."""
    make_key = make_key or _Keys()
    tar_uri = store.uri_of(tar_key)
    read = 0

    def load(sample: tuple[str, str, dict[str, bytes]]) -> SourceItem:
        key, origin, members = sample
        return _wds_item(key, members, origin, image_size, min_side)

    try:
        with store.open_read(tar_key) as stream:
            # Keys are assigned here, in tar order, before any thread sees the sample.
            samples = ((make_key(name, f"{tar_uri}/{name}"), f"{tar_uri}/{name}", members)
                       for name, members in _tar_samples(stream))
            for item in ordered_map(load, samples, workers):
                yield item
                read += 1
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        err = BadSampleError("corrupt_tar", tar_uri, f"unreadable after {read} samples: {exc}")
        yield SourceItem(make_key(f"{tar_key}.corrupt", tar_uri), None, err, tar_uri)


def _tar_samples(stream) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Consecutive members with the same key → ``(key, {extension: bytes})``, as webdataset groups them."""
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        name, members = None, {}
        for info in tar:
            match = _WDS_MEMBER.match(info.name) if info.isfile() else None
            if match is None:
                continue
            if match[1] != name:
                if members:
                    yield name, members
                name, members = match[1], {}
            # Every member is read, so a cut inside one raises ReadError rather than ending the loop quietly.
            members[match[2].lower()] = tar.extractfile(info).read()
        # A truncated archive ends the loop quietly; a whole one still has a zero block (its end marker) to read.
        end = tar.fileobj.read(tarfile.BLOCKSIZE)
        if len(end) < tarfile.BLOCKSIZE or end.strip(b"\0"):
            raise tarfile.ReadError("the archive ends early (no end-of-archive marker)")
        if members:
            yield name, members


def _wds_item(key: str, members: dict[str, bytes], origin: str, image_size: int, min_side: int) -> SourceItem:
    try:
        image_ext = next((ext for ext in WDS_IMAGE_EXTENSIONS if ext in members), None)
        if image_ext is None:
            raise BadSampleError("missing_image", origin, f"members: {', '.join(sorted(members))}")
        rgb, size = normalize_image_sized(members[image_ext], image_size, origin, min_side)
        caption = _wds_caption(members, origin)
    except BadSampleError as err:
        return SourceItem(key, None, err, origin)
    sample: dict[str, Any] = {"rgb": rgb}
    if caption:
        sample["caption"] = caption
    return SourceItem(key, sample, None, origin, size)


def _wds_caption(members: dict[str, bytes], origin: str) -> str | None:
    if "txt" in members:
        return _caption(members["txt"], f"{origin}.txt")
    if "json" not in members:
        return None
    try:
        meta = json.loads(members["json"])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadSampleError("bad_metadata", f"{origin}.json", f"not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise BadSampleError("bad_metadata", f"{origin}.json", f"expected a JSON object, got {type(meta).__name__}")
    caption = meta.get("caption")
    if not isinstance(caption, str):
        return None
    return caption.strip() or None
