"""Committed-checkpoint manifests and TensorFlow's ``checkpoint`` state file.

The checkpoint service writes a manifest (``.procsv/checkpoints/<prefix>.json``) as the commit
point of each checkpoint: it lists every file of the checkpoint with its size and checksum. The
trainer (restore), ``procsv status`` and the service itself read them through this module. Only a
checkpoint with a manifest counts as committed, and only such checkpoints are ever deleted by
retention: files procsv did not write are never touched.

Checksums are CRC-32C (Castagnoli, the checksum TensorFlow's own bundle format uses), computed by
:mod:`procsv.common.crc32c`. A manifest names its algorithm per file; new manifests always say
``"crc32c"``. Older ones (version 1, and version 2 written by an earlier procsv that fell back to
zlib where google-crc32c was missing) may say ``"crc32"``: they are still read and verified.
A checkpoint being restored is never deleted: a trainer lists, verifies and restores under a
shared ``flock`` on ``.procsv/restore.lock`` (:func:`restoring`), and retention's deletion takes it
exclusively without waiting (:func:`retiring`), leaving the retired checkpoints for later while
a restore holds it.

Imported by the trainer, the checkpoint service and the CLI.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from procsv.common import crc32c
from procsv.common.errors import CorruptCheckpoint, UnreadableCheckpoint
from procsv.common.layout import Layout, atomic_write, read_json

MANIFEST_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: the same fields, CRC-32 only
CHECKSUMS: tuple[crc32c.Algorithm, ...] = ("crc32c", "crc32")  # what a manifest's file entry may name


# ------------------------------------------------------------------------------------ manifests
@dataclass(frozen=True)
class Manifest:
    """One committed checkpoint: its step, TF prefix (relative to the logdir) and files.

    ``files`` maps each file name to ``{"size": n, "crc32c": c}`` (or ``"crc32"``). ``revision``:
    how many times this step's checkpoint was rewritten in place with a newer state of the same
    step (0: its first commit; a program whose runs change variables without advancing the global
    step, :mod:`procsv.services.checkpoint.inplace`); written to the JSON only when not 0. ``attempt``: the
    attempt of the trainer whose snapshot it is (:attr:`~procsv.ipc.messages.SaveData.attempt`; 0: not said),
    by which an audit's rollback tells a wrong timeline's checkpoints from the new one's
    (:class:`~procsv.ipc.messages.AuditQuarantine`); written only when not 0.
    """

    step: int
    prefix: str
    files: dict[str, dict[str, int]]
    committed_at: float
    reason: str
    revision: int = 0
    attempt: int = 0

    def path(self, logdir: str) -> str:
        return os.path.join(logdir, self.prefix)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "version": MANIFEST_VERSION,
            "step": self.step,
            "prefix": self.prefix,
            "files": self.files,
            "committed_at": self.committed_at,
            "reason": self.reason,
        }
        if self.revision:
            out["revision"] = self.revision
        if self.attempt:
            out["attempt"] = self.attempt
        return out

    @staticmethod
    def from_json(obj: object) -> Optional["Manifest"]:
        if not isinstance(obj, dict) or obj.get("version") not in READABLE_VERSIONS:
            return None
        try:
            files: dict[str, dict[str, int]] = {}
            for name, meta in obj["files"].items():
                algo = next(a for a in CHECKSUMS if a in meta)
                files[str(name)] = {"size": int(meta["size"]), algo: int(meta[algo])}
            return Manifest(int(obj["step"]), str(obj["prefix"]), files, float(obj["committed_at"]), str(obj["reason"]),
                            int(obj.get("revision", 0)), int(obj.get("attempt", 0)))
        except (KeyError, TypeError, ValueError, AttributeError, StopIteration, OverflowError):
            return None


def manifest_path(layout: Layout, prefix: str) -> str:
    return os.path.join(layout.manifests, prefix + ".json")


def pending_path(layout: Layout, prefix: str) -> str:
    """The checkpoint service's intent record of a commit of ``prefix`` in progress (its files being
    placed; for a rewrite in place, :mod:`procsv.services.checkpoint.inplace`): removed once committed."""
    return os.path.join(layout.manifests, prefix + ".pending")


# ------------------------------------------------------------------ restore vs retention
RESTORE_LOCK = "restore.lock"  # in .procsv/: shared while a trainer restores, exclusive while retention deletes
RESTORE_LOCK_WAIT = 30.0  # seconds a restore waits for a deletion in progress (a few unlinks) to finish


def restore_lock_path(layout: Layout) -> str:
    return os.path.join(layout.meta, RESTORE_LOCK)


def _open_lock(layout: Layout) -> Optional[int]:
    try:
        return os.open(restore_lock_path(layout), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:  # a read-only or full logdir, .procsv/ missing: no lock to take
        return None


@contextmanager
def restoring(layout: Layout, wait_secs: float = RESTORE_LOCK_WAIT, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Iterator[bool]:
    """Hold a shared lock on ``.procsv/restore.lock`` while the trainer lists, verifies and restores
    committed checkpoints, so retention deletes none of them meanwhile (:func:`retiring`). Yields
    whether the lock is held: False when the file cannot be opened (a read-only logdir) or a
    deletion held it for ``wait_secs``; the restore then goes on without it. The kernel drops the
    lock when the trainer dies."""
    fd = _open_lock(layout)
    if fd is None:
        yield False
        return
    try:
        deadline = clock() + wait_secs
        held = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:  # a deletion in progress: it does not wait for anything
                if clock() >= deadline:
                    break
                sleep(0.01)
            except OSError:  # a filesystem without flock
                break
        yield held
    finally:
        os.close(fd)


IN_PLACE_POLL = 0.01  # seconds between two looks at a prefix being rewritten in place


def _settled(layout: Layout, prefix: str) -> tuple[bool, Optional[Manifest]]:
    """(no commit of ``prefix`` in progress, its committed manifest or None)."""
    idle = not os.path.exists(pending_path(layout, prefix))
    return idle, Manifest.from_json(read_json(manifest_path(layout, prefix)))


def read_in_place(layout: Layout, prefix: str, read: Callable[[Manifest], None], *,
                  wait_secs: float = RESTORE_LOCK_WAIT, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Optional[Manifest]:
    """Read the committed checkpoint of a prefix the checkpoint service rewrites in place (a program
    without a global step's unnumbered ``<basename>``: :mod:`procsv.services.checkpoint.inplace`),
    whatever step it holds now: under the restore lock (:func:`restoring`), its files verified against
    its manifest, then ``read(manifest)``, with no commit of the prefix in progress before and the
    same manifest, none in progress, after; a rewrite meanwhile (the files renamed over before its
    manifest is the commit point) makes it look and read again, for up to ``wait_secs``. Returns the
    manifest read; None if none is committed. Raises :class:`CorruptCheckpoint` (the files fail the
    manifest while nothing rewrites them, or it was rewritten throughout ``wait_secs``) and
    :class:`UnreadableCheckpoint`; ``read`` raises :class:`CorruptCheckpoint` for files it finds
    damaged (TensorFlow's read errors), which counts as a rewrite met when the prefix has moved."""
    deadline = clock() + wait_secs
    with restoring(layout, wait_secs, clock, sleep):
        while True:
            idle, before = _settled(layout, prefix)
            if idle and before is None:
                return None
            if idle and before is not None:
                try:
                    verify(layout, before)
                    read(before)
                except CorruptCheckpoint:
                    if _settled(layout, prefix) == (True, before):  # nothing moved: the files are damaged
                        raise
                else:
                    if _settled(layout, prefix) == (True, before):
                        return before
            if clock() >= deadline:
                raise CorruptCheckpoint(f"{prefix}: rewritten in place throughout {wait_secs:.0f} s: "
                                        "no consistent read of it")
            sleep(IN_PLACE_POLL)


@contextmanager
def retiring(layout: Layout) -> Iterator[bool]:
    """Take ``.procsv/restore.lock`` exclusively without waiting, for retention's deletion. Yields
    False while a trainer restores (:func:`restoring`): the caller deletes nothing then and tries
    again later. True also when the lock file cannot be opened or locked (a full or read-only
    logdir, no flock): then no restore can hold it either, and a full disk needs the space back."""
    fd = _open_lock(layout)
    if fd is None:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        except OSError:
            free = True
        yield free
    finally:
        os.close(fd)


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


def newest_committed_since(layout: Layout, since: float, above: int) -> Optional[int]:
    """The highest step above ``above`` of a checkpoint committed at or after ``since`` (wall
    time), or None. Only manifests whose name says a step above ``above`` are read, so this costs
    one directory listing when there is none. A damaged manifest or one committed before
    ``since`` (an earlier launch's) does not count, nor does one that cannot be read: the watchdog
    calls this at a trainer's death, where an error must not stop the run."""
    for step, name in _named_steps(layout):
        if step <= above:
            break
        m = _read(layout, name)
        if m is not None and m.step == step and m.committed_at >= since:
            return step
    return None


def damaged_manifests(layout: Layout) -> list[str]:
    """Names of manifest files that are not a readable manifest (truncated, edited, not JSON), sorted.

    :func:`list_committed` never lists them; the trainer says so and counts them as corrupt.
    """
    try:
        names = os.listdir(layout.manifests)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".json") and not n.startswith(".")
                  and Manifest.from_json(read_json(os.path.join(layout.manifests, n))) is None)


def newest_committed(layout: Layout) -> Optional[Manifest]:
    """The committed checkpoint of the highest step, or None. Reads manifests from the highest step
    their names say down, and stops at the first readable one whose step is its name's: a run that
    keeps thousands of checkpoints (``max_to_keep=0``, ``keep_checkpoint_every_n_hours``) costs a
    listing, not thousands of reads (the watchdog asks at every status write, twice a second)."""
    steps = _named_steps(layout)
    i = 0
    while i < len(steps):
        same = [name for step, name in steps[i:] if step == steps[i][0]]  # prefixes of one step (rare)
        found = [m for m in (_read(layout, name) for name in same) if m is not None and m.step == steps[i][0]]
        if found:
            return max(found, key=lambda m: m.committed_at)
        i += len(same)
    return None


def _named_steps(layout: Layout) -> list[tuple[int, str]]:
    """(step its name says, name) of every manifest file, highest step first; none if the folder
    cannot be listed (not there yet, not a folder, an I/O error)."""
    try:
        names = os.listdir(layout.manifests)
    except OSError:
        return []
    steps = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        step = step_of_prefix(name[:-len(".json")])
        if step is None:  # a prefix without a step (a graph without a global step's, rewritten in place): read it
            m = _read(layout, name)
            step = m.step if m is not None else None
        if step is not None:
            steps.append((step, name))
    return sorted(steps, reverse=True)


def _read(layout: Layout, name: str) -> Optional[Manifest]:
    try:
        return Manifest.from_json(read_json(os.path.join(layout.manifests, name)))
    except OSError:
        return None


def last_checkpoint(layout: Layout) -> Optional[dict[str, Any]]:
    """The newest committed checkpoint as ``{"step", "path"}`` (for status.json), or None."""
    m = newest_committed(layout)
    return None if m is None else {"step": m.step, "path": m.path(layout.logdir)}


def verify(layout: Layout, manifest: Manifest, *, full: bool = True) -> None:
    """Check a committed checkpoint's files against its manifest.

    Raises :class:`CorruptCheckpoint` naming the first missing (ENOENT), truncated or altered
    file, and :class:`UnreadableCheckpoint` (not ``CorruptCheckpoint``) naming the file and errno
    when a file cannot be opened or read for another reason (EACCES, EIO, ESTALE, EISDIR): such a
    checkpoint may be intact. Every file is checked, so a checkpoint with one unreadable and one
    corrupt file is corrupt. ``full=False`` checks only that each file exists with its committed size.
    """
    unreadable: Optional[UnreadableCheckpoint] = None
    for name, meta in sorted(manifest.files.items()):
        path = os.path.join(layout.logdir, name)
        try:
            with open(path, "rb", buffering=0) as fh:  # open(), unlike os.open, refuses a directory
                size = os.fstat(fh.fileno()).st_size
                if size != meta["size"]:
                    raise CorruptCheckpoint(
                        f"{manifest.prefix}: file {name} has {size} bytes, {meta['size']} were committed")
                if not full:
                    continue
                algo: crc32c.Algorithm = "crc32c" if "crc32c" in meta else "crc32"
                crc = crc32c.stream_checksum(fh, algo)
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} is missing") from None
        except OSError as exc:
            unreadable = unreadable or unreadable_file(manifest.prefix, name, exc)
            continue
        if crc != meta[algo]:
            label = "CRC-32C" if algo == "crc32c" else "CRC-32"
            raise CorruptCheckpoint(f"{manifest.prefix}: file {name} fails its {label} check (altered after commit)")
    if unreadable is not None:
        raise unreadable


def unreadable_file(prefix: str, name: str, exc: OSError) -> UnreadableCheckpoint:
    """The error for a checkpoint file that exists but could not be read: names the file and errno."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else "no errno"
    return UnreadableCheckpoint(f"{prefix}: file {name} cannot be read ({code}: {exc.strerror or exc})",
                                path=name, errno=exc.errno)


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


def committed_step(layout: Layout, basename: str, step: int, numbered: bool = True) -> Optional[Manifest]:
    """The committed checkpoint of ``step`` under ``basename`` if its files verify (checksums too),
    else None (a damaged one is the commit's to set aside and write anew; a basename that would
    leave the logdir, a negative step or a name the filesystem cannot hold is the commit's to refuse)."""
    if not basename or "/" in basename or "\0" in basename or step < 0:
        return None
    try:
        done = Manifest.from_json(read_json(manifest_path(layout, f"{basename}-{step}" if numbered else basename)))
    except OSError:  # ENAMETOOLONG, EACCES, ...: not a commit found here
        return None
    if done is None or done.step != step:
        return None
    try:
        verify(layout, done)
    except (CorruptCheckpoint, UnreadableCheckpoint, OSError):
        return None
    return done
