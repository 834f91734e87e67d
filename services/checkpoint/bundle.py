"""Writing a TensorFlow tensor bundle (``<prefix>.index`` + ``<prefix>.data-00000-of-00001``).

Runs in the checkpoint service. This is the path for every numeric tensor, which sits in the
trainer's shared snapshot memory: the data file is that memory written as it is (the tensors lie
at the offsets the trainer chose), with ``O_DIRECT`` where the filesystem allows it, so the kernel
sends the pages to the disk without copying them through the page cache (on this kind of
machine a buffered write of 1 GiB costs about 4 s of CPU in page allocation; the direct write
about 0.03 s), and the checksums are computed on that memory in place (:mod:`procsv.common.crc32c`).

The index is hand-written on purpose, and only here: TensorFlow has no API that writes a bundle
from memory it does not own (``SaveV2`` takes tensors and copies them through its own buffered
writer). It is the LevelDB-style table TensorFlow's ``BundleWriter`` writes, built in Python: a
header entry, then one ``BundleEntryProto`` per tensor (dtype, shape, offset, size, masked
CRC-32C of the bytes), uncompressed blocks with masked CRC-32C trailers, an empty metaindex
block, an index block and the 48-byte footer. For the same tensors at the same offsets the result
is byte-identical to ``tf.raw_ops.SaveV2`` (tests/test_checkpoint_bundle.py checks that, with one
and with many index blocks), and ``tf.train.load_checkpoint`` reads it back.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import Sequence

from procsv.common import crc32c

BLOCK_SIZE = 262144  # tensorflow/core/lib/io/table_options.h
RESTART_INTERVAL = 16
TABLE_MAGIC = 0xDB4775248B80FB57
DIRECT_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in multiples of this
WRITE_CHUNK = 4 << 20  # one pwrite: a file grows as it is written (a commit's progress shows at its deadline)


@dataclass(frozen=True)
class BundleTensor:
    """A numeric tensor of ``size`` bytes at ``offset`` in the source memory (and the data file)."""

    key: str
    dtype_enum: int  # tensorflow DataType
    shape: tuple[int, ...]
    offset: int
    size: int


@dataclass(frozen=True)
class IndexEntry:
    """One tensor's row in the ``.index``: what its ``BundleEntryProto`` records (``crc`` unmasked)."""

    key: str
    dtype_enum: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc: int


def data_filename(prefix: str, shard: int = 0, num_shards: int = 1) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def write_bundle(prefix: str, tensors: Sequence[BundleTensor], base_address: int, source: memoryview,
                 length: int) -> int:
    """Write the bundle of ``tensors`` whose bytes are ``source[:length]``; return the data file's CRC-32C.

    ``base_address`` is the address of ``source[0]`` (page aligned for ``O_DIRECT``); ``source``
    must extend to ``length`` rounded up to :data:`DIRECT_ALIGN`. Both files are fsync'd.
    """
    file_crc, entries = write_memory_shard(data_filename(prefix), tensors, base_address, source, length)
    write_small(prefix + ".index", build_index(entries, num_shards=1))
    return file_crc


def write_memory_shard(path: str, tensors: Sequence[BundleTensor], base_address: int, source: memoryview,
                       length: int, shard: int = 0) -> tuple[int, list[IndexEntry]]:
    """Write ``source[:length]`` as the data file ``path`` (fsync'd): its CRC-32C and the tensors' entries."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    at, combine = crc32c.extend_at, crc32c.combine
    file_crc, pos, crcs = 0, 0, {}
    for t in ordered:
        if t.offset < pos or t.offset + t.size > length:
            raise ValueError(f"tensor {t.key} at [{t.offset}, {t.offset + t.size}) overlaps or exceeds {length}")
        if t.offset > pos:  # alignment padding between tensors belongs to the file too
            file_crc = combine(file_crc, at(0, base_address + pos, t.offset - pos), t.offset - pos)
        crcs[t.key] = at(0, base_address + t.offset, t.size)
        file_crc = combine(file_crc, crcs[t.key], t.size)
        pos = t.offset + t.size
    if length > pos:
        file_crc = combine(file_crc, at(0, base_address + pos, length - pos), length - pos)
    _write_data(path, source, length)
    return file_crc, [IndexEntry(t.key, t.dtype_enum, t.shape, shard, t.offset, t.size, crcs[t.key]) for t in tensors]


def _write_data(path: str, source: memoryview, length: int) -> None:
    padded = -(-length // DIRECT_ALIGN) * DIRECT_ALIGN
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags | direct, 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL or not direct:
            raise
        fd, direct = os.open(path, flags, 0o644), 0  # a filesystem without O_DIRECT
    try:
        end = padded if direct else length
        pos = 0
        while pos < end:
            try:
                pos += os.pwrite(fd, source[pos:min(end, pos + WRITE_CHUNK)], pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not direct:
                    raise
                os.close(fd)  # O_DIRECT refused at write time: start over buffered
                fd, direct = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)), 0
                end, pos = length, 0
        if end != length:
            os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_small(path: str, data: bytes) -> None:
    """Write ``data`` as the new file ``path``, fsync'd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view, pos = memoryview(data), 0
        while pos < len(data):
            pos += os.write(fd, view[pos:])
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ index table
def build_index(entries: Sequence[IndexEntry], num_shards: int) -> bytes:
    """The ``.index`` table of a bundle of ``num_shards`` data files holding ``entries``.

    The two protocol buffers are encoded here as TensorFlow serializes them (fields in number
    order, proto3 defaults left out, the shape always present), so no TensorFlow import is needed.
    """
    header = _tag(1, 0) + varint(num_shards) + _tag(3, 2) + _sized(_tag(1, 0) + varint(1))  # version.producer 1
    rows = [(b"", header)]
    for e in sorted(entries, key=lambda e: e.key.encode()):
        shape = b"".join(_tag(2, 2) + _sized(_tag(1, 0) + varint(d) if d else b"") for d in e.shape)
        entry = _tag(1, 0) + varint(e.dtype_enum) + _tag(2, 2) + _sized(shape)
        for field, number in ((3, e.shard), (4, e.offset), (5, e.size)):
            if number:
                entry += _tag(field, 0) + varint(number)
        masked_crc = crc32c.mask(e.crc)
        if masked_crc:
            entry += _tag(6, 5) + struct.pack("<I", masked_crc)
        rows.append((e.key.encode(), entry))
    return TableBuilder().build(rows)


def _tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _sized(body: bytes) -> bytes:
    return varint(len(body)) + body


def varint(n: int) -> bytes:
    """Protocol buffers' (and LevelDB's) unsigned varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Block:
    """One table block being built: prefix-compressed entries and their restart points (LevelDB's format)."""

    def __init__(self, restart_interval: int) -> None:
        self.interval = restart_interval
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last = b""

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.interval:
            limit = min(len(self.last), len(key))
            while shared < limit and self.last[shared] == key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        self.last = key
        self.counter += 1

    def size_estimate(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def empty(self) -> bool:
        return not self.buf

    def finish(self) -> bytes:
        return bytes(self.buf) + b"".join(struct.pack("<I", r) for r in self.restarts) + struct.pack(
            "<I", len(self.restarts))


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


class TableBuilder:
    """TensorFlow's ``table::TableBuilder`` with ``kNoCompression`` (tensorflow/core/lib/io)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.data = _Block(RESTART_INTERVAL)
        self.index = _Block(1)
        self.pending: tuple[int, int] | None = None
        self.last = b""
        self.count = 0

    def build(self, rows: Sequence[tuple[bytes, bytes]]) -> bytes:
        for key, value in rows:
            self._add(key, value)
        self._flush()
        meta = self._write_block(_Block(RESTART_INTERVAL))
        if self.pending is not None:
            self.index.add(_short_successor(self.last), self._handle(*self.pending))
            self.pending = None
        index = self._write_block(self.index)
        footer = self._handle(*meta) + self._handle(*index)
        footer += b"\0" * (40 - len(footer)) + struct.pack("<II", TABLE_MAGIC & 0xFFFFFFFF, TABLE_MAGIC >> 32)
        self.out += footer
        return bytes(self.out)

    def _add(self, key: bytes, value: bytes) -> None:
        if self.count and len(key) + len(value) >= 2 * BLOCK_SIZE:
            self._flush()
        if self.pending is not None:
            self.index.add(_shortest_separator(self.last, key), self._handle(*self.pending))
            self.pending = None
        self.last = key
        self.count += 1
        self.data.add(key, value)
        if self.data.size_estimate() >= BLOCK_SIZE:
            self._flush()

    def _flush(self) -> None:
        if self.data.empty():
            return
        self.pending = self._write_block(self.data)
        self.data = _Block(RESTART_INTERVAL)

    def _write_block(self, block: _Block) -> tuple[int, int]:
        contents = block.finish()
        handle = (len(self.out), len(contents))
        trailer_type = b"\0"  # kNoCompression
        self.out += contents + trailer_type + struct.pack("<I", crc32c.masked(contents + trailer_type))
        return handle

    @staticmethod
    def _handle(offset: int, size: int) -> bytes:
        return varint(offset) + varint(size)
