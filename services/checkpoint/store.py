"""The checkpoint service's atomic commit protocol, recovery at start, and retention.

Runs in the checkpoint service process (the only writer of checkpoints). A commit of
``<basename>-<step>`` goes through these steps; a crash at any of them leaves the previous
committed checkpoint as the latest loadable one:

1. the checkpoint's files into a fresh folder under ``.procsv/tmp/`` (:mod:`.writer`); fsync the files.
2. the checksum of every file (CRC-32C, :mod:`procsv.common.crc32c`); an intent record
   ``.procsv/checkpoints/<prefix>.pending`` (atomic).
3. rename the data file(s), then the index, into the logdir; fsync the logdir.
4. the manifest ``.procsv/checkpoints/<prefix>.json`` (atomic): **the commit point**.
5. TF's ``checkpoint`` state file (atomic) naming it as the latest and the ones retention keeps;
   the retired ones are deleted afterwards (:meth:`CheckpointStore.delete`): each manifest is
   renamed to ``<prefix>.pending``, then its files go, then that record.

Retention is the only reason a checkpoint is deleted. One that fails verification (corrupt) is
moved to ``.procsv/quarantine/<prefix>/`` (:meth:`CheckpointStore.quarantine`), and so are the
checkpoints of a timeline an audit rolled back (:meth:`CheckpointStore.quarantine_wrong`: their states
derive from one computed wrongly); one that cannot be read (:class:`UnreadableCheckpoint`) is left where it is.

One concern: the committed checkpoints on disk, from a commit's first file to their retirement (deletion or quarantine).

:meth:`CheckpointStore.recover` (at service start) deletes ``.procsv/tmp/*``, rolls back files
named by a ``.pending`` record that never got its manifest (an interrupted commit, or an
interrupted deletion of a retired checkpoint), and rewrites the state file from the
manifests, so a crash between steps 4 and 5 is repaired too.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

from procsv.common import faults
from procsv.common.errors import CheckpointError, CorruptCheckpoint, UnreadableCheckpoint
from procsv.common.layout import Layout, fsync_dir, read_json, write_json
from procsv.common.crc32c import file_checksum
from procsv.common.manifests import (Manifest, list_committed, manifest_path, pending_path, retiring, verify,
                                     write_state_file)
from procsv.services.checkpoint import inplace
from procsv.services.checkpoint.policy import retention

FAULT_POINTS = ("before_data_write", "after_data_write", "before_rename", "after_rename", "before_state_file",
                "after_state_file", "mid_delete")
REWRITE_FAULT_POINTS = ("before_keep", "mid_keep", "before_drop")  # reached only by a rewrite in place (:mod:`.inplace`)


def fault_point(name: str) -> None:
    """Die here with SIGKILL if ``PROCSV_FAULT`` is ``checkpoint:<point>[:<n>]`` (tests only): at
    the n-th commit (default 1) that reaches the point, in the service's first attempt only."""
    if faults.fires("checkpoint", name):
        os.kill(os.getpid(), signal.SIGKILL)


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
            rewrite = read_json(pending)
            if inplace.is_rewrite(rewrite):
                notes.append(inplace.recover(self.layout, prefix, rewrite))
            elif not os.path.exists(manifest_path(self.layout, prefix)):
                record = read_json(pending) or {}
                files = record.get("files", []) if isinstance(record, dict) else []
                for fname in files:  # a commit's intent lists names; a retired manifest maps them
                    if isinstance(fname, str) and "/" not in fname and fname.startswith(prefix + "."):
                        try:
                            os.unlink(os.path.join(self.layout.logdir, fname))
                        except FileNotFoundError:
                            pass
                retired = isinstance(record, dict) and "committed_at" in record
                notes.append(f"finished deleting retired {prefix}" if retired else f"rolled back uncommitted {prefix}")
            os.unlink(pending)
        fsync_dir(self.layout.manifests)
        fsync_dir(self.layout.logdir)
        self.last_preserved = _last_preserved(self.layout.state_file) or self.last_preserved
        committed = list_committed(self.layout)
        named = _named_latest(self.layout.state_file)
        newest = committed[-1].prefix if committed else None
        if not committed and named is not None and _foreign(self.layout, named):
            # a checkpoint procsv did not write (a plain tf.train.CheckpointManager run's): the trainer
            # restores it at the step stored in it, through this file; the first commit replaces the file
            notes.append(f"nothing committed yet; the checkpoint state file names {named!r}, which procsv did "
                         "not write: left for the trainer to restore")
            return notes
        try:
            self._write_state(committed)
        except OSError as exc:  # a full disk: the service still starts (its commits fail and say why)
            notes.append(f"could not rewrite the checkpoint state file from the manifests ({exc.strerror or exc}); "
                         "the next commit rewrites it")
            return notes
        if named is not None and os.path.basename(named) != newest:
            notes.append(f"the checkpoint state file named {named!r}, which is not the newest committed checkpoint "
                         f"(edited by hand?); rewrote it from the manifests: latest is {newest or 'none'}")
        return notes

    def commit(
        self,
        *,
        step: int,
        reason: str,
        basename: str,
        write: Callable[[str], dict[str, int]],
        max_to_keep: int,
        keep_every_n_hours: Optional[float],
        numbered: bool = True,
        revision: int = 0,
        held: frozenset[int] = frozenset(),
        attempt: int = 0,
    ) -> tuple[Manifest, list[Manifest]]:
        """Persist one checkpoint through the full protocol.

        ``write(tmp_prefix)`` writes the checkpoint's files (step 1) and returns the checksums it
        already knows, by file name. Returns the manifest and the checkpoints retention retired
        from the state file: pass them to :meth:`delete` (after telling the trainer).
        ``numbered=False``: the prefix is ``basename``, rewritten in place (:mod:`.inplace`); so is a
        committed step whose ``revision`` is below this one (a newer state of that step). ``held``: an audit's steps.
        ``attempt``: the attempt of the trainer whose snapshot it is (0: not said), in its manifest.
        """
        if not basename or "/" in basename or "\0" in basename:
            # it came over the wire: a name that would leave the logdir is refused
            raise CheckpointError(f"checkpoint basename {basename!r:.80} is not a plain file name")
        if step < 0:
            raise CheckpointError(f"checkpoint step {step} is negative")
        prefix = f"{basename}-{step}" if numbered else basename
        done = Manifest.from_json(read_json(manifest_path(self.layout, prefix)))
        old = None  # the committed checkpoint of this prefix a rewrite replaces
        if done is not None and ((not numbered and done.step != step) or (done.step == step and revision > done.revision)):
            old, done = done, None  # (one kept by keep_every_n_hours stays kept with a newer state of its step)
            reason = old.reason if old.step == step and old.reason == "preserved" else reason
        if done is not None:
            try:
                verify(self.layout, done)  # checksums too: a rare path, and a bit flip must not pass as committed
                return done, []  # this step is already committed: never rewrite a committed checkpoint
            except CorruptCheckpoint as exc:  # damaged since: set it aside and write it anew
                print(f"procsv checkpoint: {self.quarantine(done, str(exc))}", file=sys.stderr, flush=True)
        tmpdir = tempfile.mkdtemp(prefix=prefix + ".", dir=self.layout.tmp)
        try:
            tmp_prefix = os.path.join(tmpdir, prefix)
            fault_point("before_data_write")
            known = write(tmp_prefix)
            fault_point("after_data_write")
            names = sorted(n for n in os.listdir(tmpdir) if n.startswith(prefix + "."))
            files: dict[str, dict[str, int]] = {}
            for name in names:
                path = os.path.join(tmpdir, name)
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                crc = known.get(name)
                files[name] = {"size": size, "crc32c": crc if crc is not None else file_checksum(path)}
            for name in names:
                if (old is None or name not in old.files) and os.path.exists(os.path.join(self.layout.logdir, name)):
                    raise CheckpointError(
                        f"{name} already exists in the logdir and was not committed by procsv; "
                        "move it away so procsv can write its checkpoint there"
                    )
            write_json(pending_path(self.layout, prefix), {"files": names} if old is None
                       else {"files": names, "replaces": old.committed_at})
            placed: list[str] = []
            try:
                if old is not None:
                    fault_point("before_keep")
                    inplace.keep_previous(self.layout, old, lambda: fault_point("mid_keep"))
                fault_point("before_rename")
                # data files first, index last: the index is what makes a prefix look complete to TF
                for name in sorted(names, key=lambda n: n.endswith(".index")):
                    os.rename(os.path.join(tmpdir, name), os.path.join(self.layout.logdir, name))
                    placed.append(name)
                fsync_dir(self.layout.logdir)
                fault_point("after_rename")
                manifest = Manifest(step, prefix, files, self.clock(), reason, revision, attempt)
                write_json(manifest_path(self.layout, prefix), manifest.to_json())
            except OSError:
                if old is not None:  # the previous files go back where they were
                    inplace.put_back(self.layout, prefix, placed, old.files)
                    os.unlink(pending_path(self.layout, prefix))
                    raise
                self._roll_back(prefix, placed)  # a full disk must not keep an uncommitted copy's space
                raise
            if old is not None:  # before the record goes: a crash in it is finished by recover()
                inplace.drop_previous(self.layout, old, names, lambda: fault_point("before_drop"))
            os.unlink(pending_path(self.layout, prefix))
            fsync_dir(self.layout.manifests)
            fault_point("before_state_file")
            try:
                retired = self._apply_retention(max_to_keep, keep_every_n_hours, held)
            except OSError as exc:
                # committed (the manifest is the commit point) but the state file still names an
                # older checkpoint: retire nothing it may name; the next commit rewrites it
                print(f"procsv checkpoint: {prefix} is committed, but the checkpoint state file could not be "
                      f"rewritten ({exc.strerror or exc}); it still names an older checkpoint until the next "
                      "commit", file=sys.stderr, flush=True)
                retired = []
            fault_point("after_state_file")
            return manifest, retired
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _roll_back(self, prefix: str, placed: list[str]) -> None:
        """Undo a commit that failed before its manifest: unlink the files already renamed into the
        logdir, then the intent record (what :meth:`recover` would do at the next start)."""
        for name in placed:
            try:
                os.unlink(os.path.join(self.layout.logdir, name))
            except OSError:
                pass
        try:
            os.unlink(pending_path(self.layout, prefix))
        except OSError:
            pass

    def _apply_retention(self, max_to_keep: int, keep_every_n_hours: Optional[float],
                         held: frozenset[int] = frozenset()) -> list[Manifest]:
        plan = retention(list_committed(self.layout), max_to_keep, keep_every_n_hours, self.last_preserved, held)
        self.last_preserved = plan.last_preserved
        for m in plan.newly_preserved:
            kept = dataclasses.replace(m, reason="preserved")
            write_json(manifest_path(self.layout, m.prefix), kept.to_json())
        self._write_state(plan.keep)
        return list(plan.delete)

    def quarantine_corrupt_after(self, step: int) -> list[str]:
        """Quarantine committed checkpoints newer than ``step`` whose files are corrupt; one note each.

        A (re)started trainer restores the newest checkpoint that verifies, so any newer one it
        reports past was skipped as corrupt: left in place it would stay "latest" for plain
        TensorFlow and block a new commit at its step. Newer ones that verify are kept, and so are
        ones that cannot be read now (:class:`UnreadableCheckpoint`: they may be intact).
        """
        notes = []
        for m in list_committed(self.layout):
            if m.step <= step:
                continue
            try:
                verify(self.layout, m)
            except CorruptCheckpoint as exc:
                try:
                    notes.append(self.quarantine(m, str(exc)))
                except OSError as err:  # e.g. EXDEV, EACCES: left where it is, still not deleted
                    notes.append(f"could not quarantine corrupt checkpoint {m.prefix} ({exc}): {err}; left in place")
            except UnreadableCheckpoint as exc:
                notes.append(f"kept checkpoint {m.prefix}, newer than the restored step {step}: {exc}")
        if notes:
            self._write_state(list_committed(self.layout))
        return notes

    def quarantine_wrong(self, after: int, attempt: int, steps: Sequence[int], why: str) -> list[str]:
        """An audit's rollback (:class:`~procsv.ipc.messages.AuditQuarantine`): quarantine the committed
        checkpoints of ``steps`` that are after step ``after`` and were committed by trainer ``attempt`` or an
        earlier one (a manifest's attempt; 0, not said, counts as earlier), then rewrite the state file; one
        line saying which were moved (and one for each that could not be). A checkpoint of a later attempt at
        such a step (the timeline after the rollback rewrote it) and the checkpoint of ``after`` itself are
        never touched."""
        wanted = {s for s in steps if s > after}
        moved, notes = [], []
        for m in list_committed(self.layout):
            if m.step in wanted and m.attempt <= attempt:
                try:
                    self.quarantine(m, why)
                    moved.append(m.prefix)
                except OSError as err:  # e.g. EXDEV, EACCES: left where it is, still not deleted
                    notes.append(f"could not quarantine {m.prefix} ({why}): {err}; left in place")
        if moved:
            notes.insert(0, f"quarantined {', '.join(moved)}, committed after step {after} by a timeline an audit "
                            f"rolled back ({why}): moved to {self.layout.quarantine}/; nothing was deleted")
        if moved or notes:
            try:
                self._write_state(list_committed(self.layout))
            except OSError as exc:  # a full disk: the next commit rewrites it (the moved ones are no longer committed)
                notes.append(f"could not rewrite the checkpoint state file after the quarantine: {exc}")
        return notes

    def quarantine(self, m: Manifest, why: str) -> str:
        """Move a checkpoint that failed verification (or one of a wrong timeline) out of the way, never deleting it: its files,
        then its manifest (the commit point, last, so a crash in between leaves a manifest whose
        files are missing, which is quarantined again), into ``.procsv/quarantine/<prefix>/``
        (``<prefix>.2/``, ... if that is taken). Return one line saying where it went.

        The caller rewrites the state file. Only files the manifest names are moved.
        """
        base = self.layout.quarantined(m.prefix)
        os.makedirs(self.layout.quarantine, exist_ok=True)
        folder, n = base, 1
        while True:
            try:
                os.mkdir(folder)
                break
            except FileExistsError:
                n += 1
                folder = f"{base}.{n}"
        moved = 0
        for name in m.files:
            if "/" in name or not name.startswith(m.prefix + "."):
                continue
            try:
                os.rename(os.path.join(self.layout.logdir, name), os.path.join(folder, name))
                moved += 1
            except FileNotFoundError:
                pass
        fsync_dir(folder)
        fsync_dir(self.layout.logdir)
        try:
            os.rename(manifest_path(self.layout, m.prefix), os.path.join(folder, m.prefix + ".json"))
        except FileNotFoundError:
            pass
        fsync_dir(folder)
        fsync_dir(self.layout.manifests)
        return (f"quarantined corrupt checkpoint {m.prefix} ({why}): moved its manifest and {moved} file(s) "
                f"to {folder}; nothing was deleted")

    def delete(self, retired: Sequence[Manifest]) -> list[Manifest]:
        """Delete retired checkpoints, unless a trainer is restoring (it holds
        ``.procsv/restore.lock``, :func:`~procsv.common.manifests.restoring`): then nothing is
        deleted and ``retired`` is returned, to be passed again later (a checkpoint being restored
        is never deleted). Returns [] once done.

        Each manifest is first renamed to ``<prefix>.pending`` (it names the files, as a commit's
        intent record does): the checkpoint leaves the committed list at once, never as a manifest
        without files, and a crash before its files are gone leaves that record, by which
        :meth:`recover` finishes the deletion. Only files a manifest names are deleted."""
        if not retired:
            return []
        with retiring(self.layout) as free:
            if not free:
                return list(retired)
            self._delete(retired)
        return []

    def delete_all(self) -> Optional[int]:
        """Delete every committed checkpoint (a trainer's ``DeleteCheckpoints``: Keras's
        ``delete_checkpoint=True``), the state file first, then each one as :meth:`delete` does
        (pending record, files, record); None, deleting nothing, while a trainer restores. Returns
        how many were deleted."""
        with retiring(self.layout) as free:
            if not free:
                return None
            committed = list_committed(self.layout)
            try:
                os.unlink(self.layout.state_file)  # first the pointer: a kill midway leaves no dangling one
            except FileNotFoundError:
                pass
            fsync_dir(self.layout.logdir)
            self._delete(committed)
        return len(committed)

    def _delete(self, retired: Sequence[Manifest]) -> None:
        retiring_now = []
        for m in retired:
            try:
                os.rename(manifest_path(self.layout, m.prefix), pending_path(self.layout, m.prefix))
            except FileNotFoundError:
                continue
            retiring_now.append(m)
        if not retiring_now:
            return
        fsync_dir(self.layout.manifests)
        for m in retiring_now:
            for name in m.files:
                if "/" in name or not name.startswith(m.prefix + "."):
                    continue
                try:
                    os.unlink(os.path.join(self.layout.logdir, name))
                except FileNotFoundError:
                    pass
                fault_point("mid_delete")
        fsync_dir(self.layout.logdir)
        for m in retiring_now:
            os.unlink(pending_path(self.layout, m.prefix))
        fsync_dir(self.layout.manifests)

    def _write_state(self, committed: list[Manifest]) -> None:
        write_state_file(self.layout, committed, self.last_preserved)


def _last_preserved(state_file: str) -> Optional[float]:
    """``last_preserved_timestamp`` of an existing state file (so keep_every_n_hours survives restarts)."""
    try:
        with open(state_file) as fh:
            for line in fh:
                if line.startswith("last_preserved_timestamp:"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def _foreign(layout: Layout, named: str) -> bool:
    """Whether ``named`` (a state file's ``model_checkpoint_path``) is a checkpoint of the logdir that
    procsv did not write: its ``.index`` file is there and no manifest (valid or damaged) names it."""
    path = named if os.path.isabs(named) else os.path.join(layout.logdir, named)
    return (os.path.dirname(os.path.abspath(path)) == os.path.abspath(layout.logdir)
            and os.path.isfile(path + ".index")
            and not os.path.exists(manifest_path(layout, os.path.basename(path))))


def _named_latest(state_file: str) -> Optional[str]:
    """The ``model_checkpoint_path`` an existing state file names, or None (no file, or none named)."""
    try:
        with open(state_file, errors="replace") as fh:
            for line in fh:
                if line.startswith("model_checkpoint_path:"):
                    return line.split(":", 1)[1].strip().strip('"')
    except OSError:
        return None
    return None
