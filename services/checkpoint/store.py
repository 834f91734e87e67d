"""The checkpoint service's atomic commit protocol, recovery at start, and retention.

Runs in the checkpoint service process (the only writer of checkpoints). A commit of
``<basename>-<step>`` goes through these steps; a crash at any of them leaves the previous
committed checkpoint as the latest loadable one:

1. ``SaveV2`` + ``MergeV2Checkpoints`` into a fresh folder under ``.procsv/tmp/``; fsync the files.
2. CRC-32 of every file; an intent record ``.procsv/checkpoints/<prefix>.pending`` (atomic).
3. rename the data file(s), then the index, into the logdir; fsync the logdir.
4. the manifest ``.procsv/checkpoints/<prefix>.json`` (atomic): **the commit point**.
5. TF's ``checkpoint`` state file (atomic) naming it as the latest; retention deletes old ones.

:meth:`CheckpointStore.recover` (at service start) deletes ``.procsv/tmp/*``, rolls back files
named by a ``.pending`` record that never got its manifest, and rewrites the state file from the
manifests, so a crash between steps 4 and 5 is repaired too.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ipc.messages import TensorSpec
from procsv.errors import CheckpointError
from procsv.layout import Layout, fsync_dir, read_json, write_json
from procsv.manifests import Manifest, file_crc32, list_committed, manifest_path, write_state_file
from services.checkpoint.policy import retention

FAULT_ENV = "PROCSV_FAULT"  # e.g. "checkpoint:after_rename" -- SIGKILLs the service there (tests)


def fault_point(name: str) -> None:
    """Die here with SIGKILL if the fault-injection variable names this point (tests only)."""
    spec = os.environ.get(FAULT_ENV, "")
    if spec and spec == f"checkpoint:{name}":
        os.kill(os.getpid(), signal.SIGKILL)


def arrays_from_frames(specs: Sequence[TensorSpec], frames: Sequence[Any], np_dtype: Callable[[str], Any]) -> list[Any]:
    """Rebuild numpy arrays (zero-copy for numeric tensors) from the received frames."""
    if len(specs) != len(frames):
        raise CheckpointError(f"snapshot has {len(specs)} tensor specs but {len(frames)} frames")
    arrays = []
    for spec, frame in zip(specs, frames):
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if spec.lengths is not None:
            raw = bytes(buf)
            items, pos = [], 0
            for n in spec.lengths:
                items.append(raw[pos:pos + n])
                pos += n
            arr = np.array(items, dtype=object).reshape(spec.shape)
        else:
            arr = np.frombuffer(buf, dtype=np_dtype(spec.dtype)).reshape(spec.shape)
        arrays.append(arr)
    return arrays


class CheckpointStore:
    """Writes and retires the checkpoints of one logdir. ``clock`` gives commit timestamps."""

    def __init__(self, layout: Layout, clock: Callable[[], float] = time.time) -> None:
        self.layout = layout
        self.clock = clock
        self.last_preserved = clock()

    def recover(self) -> list[str]:
        """Undo interrupted commits and re-derive the state file; return what was repaired."""
        notes: list[str] = []
        os.makedirs(self.layout.tmp, exist_ok=True)
        os.makedirs(self.layout.manifests, exist_ok=True)
        for name in os.listdir(self.layout.tmp):
            shutil.rmtree(os.path.join(self.layout.tmp, name), ignore_errors=True)
            notes.append(f"removed unfinished write {name}")
        for name in os.listdir(self.layout.manifests):
            if not name.endswith(".pending"):
                continue
            prefix = name[: -len(".pending")]
            pending = os.path.join(self.layout.manifests, name)
            if not os.path.exists(manifest_path(self.layout, prefix)):
                record = read_json(pending) or {}
                for fname in record.get("files", []):
                    if isinstance(fname, str) and "/" not in fname:
                        try:
                            os.unlink(os.path.join(self.layout.logdir, fname))
                        except FileNotFoundError:
                            pass
                notes.append(f"rolled back uncommitted {prefix}")
            os.unlink(pending)
        fsync_dir(self.layout.manifests)
        fsync_dir(self.layout.logdir)
        self._write_state(list_committed(self.layout))
        return notes

    def commit(
        self,
        *,
        step: int,
        reason: str,
        basename: str,
        keys: Sequence[str],
        arrays: Sequence[Any],
        max_to_keep: int,
        keep_every_n_hours: Optional[float],
    ) -> Manifest:
        """Persist one snapshot through the full protocol and return its manifest."""
        import tensorflow as tf

        prefix = f"{basename}-{step}"
        existing = read_json(manifest_path(self.layout, prefix))
        done = Manifest.from_json(existing)
        if done is not None:
            return done  # this step is already committed: never rewrite a committed checkpoint
        tmpdir = tempfile.mkdtemp(prefix=prefix + ".", dir=self.layout.tmp)
        try:
            tmp_prefix = os.path.join(tmpdir, prefix)
            part = tmp_prefix + "_temp/part-00000-of-00001"
            tf.raw_ops.SaveV2(
                prefix=part,
                tensor_names=list(keys),
                shape_and_slices=[""] * len(keys),
                tensors=[tf.constant(a) for a in arrays],
            )
            tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=[part], destination_prefix=tmp_prefix, delete_old_dirs=True
            )
            fault_point("after_data_write")
            names = sorted(n for n in os.listdir(tmpdir) if n.startswith(prefix + "."))
            files: dict[str, dict[str, int]] = {}
            for name in names:
                path = os.path.join(tmpdir, name)
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
                files[name] = {"size": os.path.getsize(path), "crc32": file_crc32(path)}
            for name in names:
                if os.path.exists(os.path.join(self.layout.logdir, name)):
                    raise CheckpointError(
                        f"{name} already exists in the logdir and was not committed by procsv; "
                        "move it away so procsv can write its checkpoint there"
                    )
            write_json(os.path.join(self.layout.manifests, prefix + ".pending"), {"files": names})
            fault_point("before_rename")
            # data files first, index last: the index is what makes a prefix look complete to TF
            for name in sorted(names, key=lambda n: n.endswith(".index")):
                os.rename(os.path.join(tmpdir, name), os.path.join(self.layout.logdir, name))
            fsync_dir(self.layout.logdir)
            fault_point("after_rename")
            manifest = Manifest(step, prefix, files, self.clock(), reason)
            write_json(manifest_path(self.layout, prefix), manifest.to_json())
            os.unlink(os.path.join(self.layout.manifests, prefix + ".pending"))
            fsync_dir(self.layout.manifests)
            fault_point("before_state_file")
            self._apply_retention(max_to_keep, keep_every_n_hours)
            fault_point("after_state_file")
            return manifest
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _apply_retention(self, max_to_keep: int, keep_every_n_hours: Optional[float]) -> None:
        plan = retention(list_committed(self.layout), max_to_keep, keep_every_n_hours, self.last_preserved)
        self.last_preserved = plan.last_preserved
        for m in plan.newly_preserved:
            kept = Manifest(m.step, m.prefix, m.files, m.committed_at, "preserved")
            write_json(manifest_path(self.layout, m.prefix), kept.to_json())
        self._write_state(plan.keep)
        for m in plan.delete:
            # the manifest goes first: a crash here leaves orphan files, never a manifest without files
            os.unlink(manifest_path(self.layout, m.prefix))
            for name in m.files:
                try:
                    os.unlink(os.path.join(self.layout.logdir, name))
                except FileNotFoundError:
                    pass
        if plan.delete:
            fsync_dir(self.layout.manifests)
            fsync_dir(self.layout.logdir)

    def _write_state(self, committed: list[Manifest]) -> None:
        write_state_file(self.layout, committed, self.last_preserved)
