"""Committed-checkpoint manifests, file checksums, and TensorFlow's ``checkpoint`` state file.

The checkpoint service writes a manifest (``.procsv/checkpoints/<prefix>.json``) as the commit
point of each checkpoint: it lists every file of the checkpoint with its size and checksum. The
trainer (restore), ``procsv status`` and the service itself read them through this module. Only a
checkpoint with a manifest counts as committed, and only such checkpoints are ever deleted by
retention: files procsv did not write are never touched.

Checksums are CRC-32C (Castagnoli, the checksum TensorFlow's own bundle format uses) when the
``google-crc32c`` package's hardware-accelerated C library is importable (about 10 GB/s here),
else zlib's CRC-32 (about 1.8 GB/s). A manifest names its algorithm per file (``"crc32c"`` or
``"crc32"``), so either kind verifies anywhere zlib or the library is available. Imported by the
trainer, the checkpoint service and the CLI.
"""

from __future__ import annotations

import ctypes
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from procsv.common.errors import CorruptCheckpoint
from procsv.common.layout import Layout, atomic_write, read_json

MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: the same fields, CRC-32 only
_CHUNK = 8 << 20


# ------------------------------------------------------------------------------------ CRC-32C
def _load_crc32c() -> Optional[Callable[[int, int, int], int]]:
    """``crc32c_extend(crc, address, length)`` from google-crc32c's C library, or None."""
    try:
        from google_crc32c import _crc32c  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        fn = ctypes.CDLL(_crc32c.__file__).crc32c_extend  # dlsym searches its dependency, libcrc32c
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]  # ctypes drops the GIL meanwhile
    if fn(0, ctypes.cast(ctypes.c_char_p(b"123456789"), ctypes.c_void_p), 9) != 0xE3069283:
        return None  # the standard check value of CRC-32C
    return fn


_crc32c_extend = _load_crc32c()
HAVE_CRC32C = _crc32c_extend is not None
CHECKSUM = "crc32c" if HAVE_CRC32C else "crc32"  # what this process records in new manifests


def crc32c_at(address: int, length: int, crc: int = 0) -> int:
    """CRC-32C of ``length`` bytes at ``address``, continuing ``crc``. Needs :data:`HAVE_CRC32C`."""
    if _crc32c_extend is None:
        raise RuntimeError("CRC-32C needs the google-crc32c package")
    return int(_crc32c_extend(crc, address, length)) if length else crc


def crc32c(data: Any, crc: int = 0) -> int:
    """CRC-32C of a bytes-like object (no copy)."""
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    return crc32c_at(arr.ctypes.data, arr.size, crc)


def mask_crc32c(crc: int) -> int:
    """TensorFlow's (and LevelDB's) masked CRC, as stored in tensor bundles and table blocks."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


_POLY_C = 0x82F63B78  # CRC-32C, reflected
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
        one_bit = [_POLY_C] + [1 << i for i in range(31)]
        op = one_bit
        for _ in range(3):  # 1 bit -> 2 -> 4 -> 8 bits = one zero byte
            op = [_gf2_times(op, v) for v in op]
        for _ in range(64):
            _SHIFT_OPS.append(op)
            op = [_gf2_times(op, v) for v in op]
    return _SHIFT_OPS


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32C of A+B from crc(A), crc(B) and len(B), without touching the bytes (zlib's method)."""
    ops = _shift_ops()
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(ops[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2


def file_checksum(path: str, algorithm: str = "") -> int:
    """The checksum of a whole file with ``algorithm`` (default :data:`CHECKSUM`)."""
    algorithm = algorithm or CHECKSUM
    if algorithm == "crc32c" and not HAVE_CRC32C:
        raise RuntimeError("CRC-32C needs the google-crc32c package")
    crc = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                return crc
            crc = crc32c(view[:n], crc) if algorithm == "crc32c" else zlib.crc32(view[:n], crc)


def file_crc32(path: str) -> int:
    """zlib CRC-32 of a whole file (the checksum of version-1 manifests)."""
    return file_checksum(path, "crc32")


# ------------------------------------------------------------------------------------ manifests
@dataclass(frozen=True)
class Manifest:
    """One committed checkpoint: its step, TF prefix (relative to the logdir) and files.

    ``files`` maps each file name to ``{"size": n, "crc32c": c}`` (or ``"crc32"``).
    """

    step: int
    prefix: str
    files: dict[str, dict[str, int]]
    committed_at: float
    reason: str

    def path(self, logdir: str) -> str:
        return os.path.join(logdir, self.prefix)

    def to_json(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "step": self.step,
            "prefix": self.prefix,
            "files": self.files,
            "committed_at": self.committed_at,
            "reason": self.reason,
        }

    @staticmethod
    def from_json(obj: object) -> Optional["Manifest"]:
        if not isinstance(obj, dict) or obj.get("version") not in READABLE_VERSIONS:
            return None
        try:
            files: dict[str, dict[str, int]] = {}
            for name, meta in obj["files"].items():
                algo = next(a for a in ("crc32c", "crc32") if a in meta)
                files[str(name)] = {"size": int(meta["size"]), algo: int(meta[algo])}
            return Manifest(int(obj["step"]), str(obj["prefix"]), files, float(obj["committed_at"]), str(obj["reason"]))
        except (KeyError, TypeError, ValueError, AttributeError, StopIteration):
            return None


def manifest_path(layout: Layout, prefix: str) -> str:
    return os.path.join(layout.manifests, prefix + ".json")


def list_committed(layout: Layout) -> list[Manifest]:
    """Every committed checkpoint of this logdir, oldest (lowest step) first."""
    try:
        names = os.listdir(layout.manifests)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            m = Manifest.from_json(read_json(os.path.join(layout.manifests, name)))
            if m is not None:
                found.append(m)
    found.sort(key=lambda m: (m.step, m.committed_at))
    return found


def verify(layout: Layout, manifest: Manifest, *, full: bool = True) -> None:
    """Raise :class:`CorruptCheckpoint` naming the first missing, truncated or altered file.

    A CRC-32C recorded where google-crc32c is missing is not recomputed (sizes are still
    checked); TensorFlow's restore then still checks each tensor's own CRC-32C.
    """
    for name, meta in sorted(manifest.files.items()):
        path = os.path.join(layout.logdir, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} is missing") from None
        if size != meta["size"]:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} has {size} bytes, {meta['size']} were committed")
        if not full:
            continue
        algo = "crc32c" if "crc32c" in meta else "crc32"
        if algo == "crc32c" and not HAVE_CRC32C:
            continue
        if file_checksum(path, algo) != meta[algo]:
            label = "CRC-32C" if algo == "crc32c" else "CRC-32"
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} fails its {label} check (altered after commit)")


def write_state_file(layout: Layout, committed: list[Manifest], last_preserved: float) -> None:
    """Write TF's ``checkpoint`` text proto atomically (TF's own writer does not fsync)."""
    if not committed:
        try:
            os.unlink(layout.state_file)
        except FileNotFoundError:
            pass
        return
    lines = [f"model_checkpoint_path: {_quote(committed[-1].prefix)}"]
    lines += [f"all_model_checkpoint_paths: {_quote(m.prefix)}" for m in committed]
    lines += [f"all_model_checkpoint_timestamps: {m.committed_at!r}" for m in committed]
    lines.append(f"last_preserved_timestamp: {last_preserved!r}")
    atomic_write(layout.state_file, "\n".join(lines) + "\n")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_STEP_RE = re.compile(r"-(\d+)$")


def step_of_prefix(prefix: str) -> Optional[int]:
    m = _STEP_RE.search(os.path.basename(prefix))
    return int(m.group(1)) if m else None
