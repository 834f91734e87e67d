"""Committed-checkpoint manifests and TensorFlow's ``checkpoint`` state file.

The checkpoint service writes a manifest (``.procsv/checkpoints/<prefix>.json``) as the commit
point of each checkpoint: it lists every file of the checkpoint with its size and CRC-32. The
trainer (restore), ``procsv status`` and the service itself read them through this module. Only a
checkpoint with a manifest counts as committed, and only such checkpoints are ever deleted by
retention: files procsv did not write are never touched.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from typing import Optional

from procsv.errors import CorruptCheckpoint
from procsv.layout import Layout, atomic_write, read_json

MANIFEST_VERSION = 1
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Manifest:
    """One committed checkpoint: its step, TF prefix (relative to the logdir) and files."""

    step: int
    prefix: str
    files: dict[str, dict[str, int]]  # file name -> {"size": n, "crc32": c}
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
        if not isinstance(obj, dict) or obj.get("version") != MANIFEST_VERSION:
            return None
        try:
            files = {str(k): {"size": int(v["size"]), "crc32": int(v["crc32"])} for k, v in obj["files"].items()}
            return Manifest(int(obj["step"]), str(obj["prefix"]), files, float(obj["committed_at"]), str(obj["reason"]))
        except (KeyError, TypeError, ValueError, AttributeError):
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


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


def verify(layout: Layout, manifest: Manifest, *, full: bool = True) -> None:
    """Raise :class:`CorruptCheckpoint` naming the first missing, truncated or altered file."""
    for name, meta in sorted(manifest.files.items()):
        path = os.path.join(layout.logdir, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} is missing") from None
        if size != meta["size"]:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} has {size} bytes, {meta['size']} were committed")
        if full and file_crc32(path) != meta["crc32"]:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} fails its CRC-32 check (altered after commit)")


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
