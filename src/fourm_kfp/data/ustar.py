"""The ustar tars of our shards, written and read member by member without ``tarfile``'s per-member Python.

A tar is 512-byte header blocks, each followed by its data padded to 512 bytes, ended by two zero blocks and zeros
to a whole record. :class:`TarSpool` writes the bytes ``tarfile`` writes for our members (ustar format, fixed
metadata) from a header template: ``tarfile`` spends ~50 µs a member, which capped the pretokenize writer at ~1,300
samples/s. :func:`read_members` reads them back with one slice and one integer per header, where ``tarfile``
decodes every field (it was a third of a loader worker's time); each header's checksum is verified, and a tar the
writer could not have written (cut short, damaged, with pax or GNU headers) is a :class:`ShardReadError` naming it.
"""

from __future__ import annotations

import tarfile
from typing import Any, Iterator

from fourm_kfp.errors import UserError

BLOCK = tarfile.BLOCKSIZE
# The header fields this module reads or writes (the others come from tarfile's template).
_NAME, _SIZE, _CHECKSUM, _TYPE = slice(0, 100), slice(124, 136), slice(148, 156), slice(156, 157)
_MAGIC, _PREFIX = slice(257, 262), slice(345, 500)
_REGULAR = (b"0", b"\0", b"7")  # regular file (and the contiguous-file type, read the same way)
_EXTENDED = (b"x", b"g", b"L", b"K")  # pax and GNU headers: names and sizes the shard writer never needs


class ShardReadError(UserError):
    """A shard tar that cannot be read (a bad header, an archive cut short, a format the shard writer never
    writes)."""


def _checksum(header: bytes) -> int:
    """The header's checksum: the sum of its bytes with the checksum field counted as spaces."""
    return sum(header[:_CHECKSUM.start]) + 8 * ord(" ") + sum(header[_CHECKSUM.stop:])


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    """A member with the fixed metadata of our shards (no time, no owner)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
    return info


_TEMPLATE = _tarinfo("", 0).tobuf(tarfile.USTAR_FORMAT)


def member_header(name: str, size: int) -> bytes:
    """The ustar header ``tarfile`` writes for member ``name`` of ``size`` bytes: its header for an empty name and
    size with those two fields and the checksum filled in (``tarfile`` itself for names over 100 bytes, which it
    splits)."""
    encoded = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(encoded) > _NAME.stop or size >= 8**11:
        return _tarinfo(name, size).tobuf(tarfile.USTAR_FORMAT)
    header = b"".join((encoded.ljust(_NAME.stop, b"\0"), _TEMPLATE[_NAME.stop:_SIZE.start], b"%011o\0" % size,
                       _TEMPLATE[_SIZE.stop:]))
    return b"".join((header[:_CHECKSUM.start], b"%06o\0 " % _checksum(header), header[_CHECKSUM.stop:]))


class TarSpool:
    """A ustar tar written to a local file member by member: the bytes ``tarfile`` writes for the same members."""

    def __init__(self, path: str):
        self._file = open(path, "wb")
        self._offset = 0

    def add(self, name: str, data: bytes) -> None:
        header, padding = member_header(name, len(data)), -len(data) % BLOCK
        self._file.write(header)
        self._file.write(data)
        self._file.write(b"\0" * padding)
        self._offset += len(header) + len(data) + padding

    def close(self) -> None:
        """The end-of-archive blocks, then zeros to a whole record (as ``tarfile`` does)."""
        end = 2 * BLOCK
        self._file.write(b"\0" * (end + -(self._offset + end) % tarfile.RECORDSIZE))
        self._file.close()


def _read_exact(stream: Any, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _octal(field: bytes) -> int:
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def read_members(stream: Any, where: str) -> Iterator[tuple[str, bytes]]:
    """``(member name, bytes)`` of the regular files of a ustar tar (what :class:`TarSpool` writes), streamed;
    ``where`` names the tar in errors."""
    while True:
        header = _read_exact(stream, BLOCK)
        if not header.strip(b"\0"):
            return  # the end-of-archive zero block (or a tar with no members)
        if len(header) < BLOCK:
            raise ShardReadError(f"{where}: the archive ends inside a member header")
        try:
            stored, size = _octal(header[_CHECKSUM]), _octal(header[_SIZE])
        except ValueError:
            raise ShardReadError(f"{where}: not a tar (a header with a non-octal size or checksum)") from None
        if stored != _checksum(header):
            raise ShardReadError(f"{where}: a tar header with a bad checksum (a corrupt shard; re-run the stage "
                                 "that wrote it)")
        kind = header[_TYPE]
        if kind in _EXTENDED:
            raise ShardReadError(f"{where}: a pax or GNU extended header, which the shard writer never writes "
                                 "(a foreign shard)")
        data = _read_exact(stream, size)
        if len(data) < size:
            raise ShardReadError(f"{where}: the archive ends inside a member ({len(data)} of {size} bytes)")
        _read_exact(stream, -size % BLOCK)  # the padding
        if kind in _REGULAR:
            name = header[_NAME].split(b"\0", 1)[0]
            if header[_MAGIC] == b"ustar" and header[_PREFIX.start]:
                name = header[_PREFIX].split(b"\0", 1)[0] + b"/" + name
            yield name.decode("utf-8"), data
