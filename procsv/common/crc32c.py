"""CRC-32C (Castagnoli): the one checksum module of procsv.

Imported by every process that writes or checks procsv's files: the checkpoint service (the
tensor bundle's per-tensor and per-block checksums, the manifest checksums), the trainer and the
CLI (verifying a checkpoint before restoring it or reporting it), and the summary service (the
masked CRCs of TFRecord framing). It offers the plain value of bytes, extending a CRC over bytes or
over memory at an address, combining two CRCs without the bytes, TensorFlow's masking, and the
checksum of a whole file.

The computation is google-crc32c's C library (hardware CRC instructions, about 10 GB/s here),
a hard dependency of procsv. Bytes go through its public ``value``/``extend``. Memory at an
address goes to the library's ``crc32c_extend`` symbol directly, through ctypes, because the
public ``extend`` does not fit the checkpoint service's case -- checked with google-crc32c 1.9:

* it parses its argument with ``y#``, which accepts only read-only buffers without a
  release-buffer hook: a ``memoryview`` of the trainer's shared memory, the ``mmap`` itself or a
  ``bytearray`` raise ``TypeError``, so it would need a ``bytes`` copy of every tensor;
* a NumPy view of that memory happens to be accepted, but the extension drops the GIL only for
  ``bytes`` of 1 MiB or more, so a NumPy view of a 1 GiB checkpoint holds the GIL for ~0.1 s.

A ctypes call takes an address and a length, copies nothing and drops the GIL for the whole call.
The symbol is looked up in the extension module's shared object (``dlsym`` searches its
dependency, libcrc32c) and checked against the standard check value at import.
"""

from __future__ import annotations

import ctypes
import io
import os
import zlib
from typing import Callable, Literal

import google_crc32c
from google_crc32c import _crc32c  # the C extension, for the file name of its shared object

Algorithm = Literal["crc32c", "crc32"]

CHECK_VALUE = 0xE3069283  # CRC-32C of b"123456789"
_MASK_DELTA = 0xA282EAD8
_POLY = 0x82F63B78  # CRC-32C, reflected
_FILE_CHUNK = 8 << 20
_MIN_CHUNK = 64 << 10  # a file that grows while read is still read in chunks of a sane size


def _load_extend_at() -> Callable[[int, int, int], int]:
    try:
        fn = ctypes.CDLL(_crc32c.__file__).crc32c_extend
    except (OSError, AttributeError) as exc:
        raise ImportError(f"google-crc32c's C library has no usable crc32c_extend symbol: {exc}") from exc
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    if fn(0, b"123456789", 9) != CHECK_VALUE:
        raise ImportError("google-crc32c's crc32c_extend does not compute CRC-32C")
    return fn


_extend_at = _load_extend_at()


def value(data: bytes) -> int:
    """CRC-32C of ``data``."""
    return int(google_crc32c.value(data))


def extend(crc: int, data: bytes) -> int:
    """CRC-32C of the bytes ``crc`` covers followed by ``data``."""
    return int(google_crc32c.extend(crc, data))


def extend_at(crc: int, address: int, length: int) -> int:
    """CRC-32C continued over ``length`` bytes of memory at ``address`` (no copy, GIL released)."""
    return int(_extend_at(crc, address, length)) if length else crc


def mask(crc: int) -> int:
    """TensorFlow's (and LevelDB's) masked CRC, as stored in tensor bundles, tables and TFRecords."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked(data: bytes) -> int:
    """``mask(value(data))``: the CRC of a TFRecord's length or data field."""
    return mask(google_crc32c.value(data))


# ------------------------------------------------------------------------------------ combine
_SHIFT_OPS: list[list[int]] = []  # _SHIFT_OPS[k]: the GF(2) operator "append 2**k zero bytes"


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _shift_ops() -> list[list[int]]:
    if not _SHIFT_OPS:
        op = [_POLY] + [1 << i for i in range(31)]  # append one zero bit
        for _ in range(3):  # 1 bit -> 2 -> 4 -> 8 bits = one zero byte
            op = [_gf2_times(op, v) for v in op]
        for _ in range(64):
            _SHIFT_OPS.append(op)
            op = [_gf2_times(op, v) for v in op]
    return _SHIFT_OPS


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32C of A+B from crc(A), crc(B) and len(B), without touching the bytes (zlib's method)."""
    ops = _shift_ops()
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(ops[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


# ------------------------------------------------------------------------------------ files
def file_checksum(path: str, algorithm: Algorithm = "crc32c") -> int:
    """The checksum of a whole file: CRC-32C, or zlib's CRC-32 to verify version-1 manifests."""
    with open(path, "rb", buffering=0) as fh:
        return stream_checksum(fh, algorithm)


def stream_checksum(fh: io.RawIOBase, algorithm: Algorithm = "crc32c") -> int:
    """The checksum of what is left to read in an unbuffered binary file (see :func:`file_checksum`).

    The read buffer is sized to what is left (at most :data:`_FILE_CHUNK`): a ctypes buffer is
    zeroed when made, and an 8 MiB one for each small file of a checkpoint cost a promoted trainer's
    restore 20 ms in first-touch page faults (3 files of 60 KB), where the checksums take 0.1 ms."""
    crc = 0
    try:
        left = os.fstat(fh.fileno()).st_size - fh.tell()
    except (OSError, ValueError, AttributeError):  # not a real file (no fileno/tell), or closed: read in whole chunks
        left = _FILE_CHUNK
    buf = (ctypes.c_char * min(_FILE_CHUNK, max(_MIN_CHUNK, left + 1)))()  # +1: the read that finds the end
    address = ctypes.addressof(buf)
    view = memoryview(buf).cast("B")
    while True:
        n = fh.readinto(view)
        if not n:
            return crc
        crc = extend_at(crc, address, n) if algorithm == "crc32c" else zlib.crc32(view[:n], crc)
