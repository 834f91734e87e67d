"""Rewriting a checkpoint under a fixed prefix, atomically: the previous files kept until the commit point.

Runs in the checkpoint service process, inside :meth:`CheckpointStore.commit`. TF's Supervisor names
the checkpoints of a graph without a global step ``<basename>`` (``saver.save(sess, save_path,
global_step=None)``) and rewrites that one prefix at each save; procsv does the same (the trainer's
:class:`~procsv.ipc.messages.SaveData` says ``numbered=False``), so the new files replace committed
ones of the same names. So does a newer state of a committed step (``SaveData.revision`` above the
manifest's: runs that trained without advancing the global step, where TF saves ``model.ckpt-<step>``
again). A rename over a file is atomic, but two files (data, then index) are not replaced at once,
so the commit of such a rewrite is:

1. the new files written, fsynced and checksummed under ``.procsv/tmp/`` (as every commit);
2. the intent record ``.procsv/checkpoints/<prefix>.pending`` naming the new files and the
   ``committed_at`` of the manifest it replaces (``replaces``);
3. the committed files hard-linked into ``.procsv/checkpoints/<prefix>.prev/`` (:func:`keep_previous`),
   fsynced: the previous checkpoint survives the renames;
4. the data file(s), then the index, renamed over the old ones; the logdir fsynced;
5. the manifest rewritten (atomic): **the commit point**; the ``.prev`` folder dropped
   (:func:`drop_previous`), with any old file the new checkpoint has not, then the record removed.

A crash before 5 leaves the record with the old manifest: :func:`recover` (at the service's start,
before any trainer restores) renames the kept files back over the new ones, so the previous
checkpoint is whole again; a crash after it finds the new manifest and finishes the drop (the old
files the new checkpoint has not are the kept ones it does not list: they never outlive a crash).
A restore verifies the files against the manifest either way (sizes and CRC-32C).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Collection, TypeGuard

from procsv.common.layout import Layout, fsync_dir, read_json
from procsv.common.manifests import Manifest, manifest_path


def previous_dir(layout: Layout, prefix: str) -> str:
    """Where the committed files of ``prefix`` are kept while a rewrite is not committed."""
    return os.path.join(layout.manifests, prefix + ".prev")


def _own(prefix: str, name: str) -> bool:
    return "/" not in name and name.startswith(prefix + ".")


def keep_previous(layout: Layout, old: Manifest, linked: Callable[[], None] = lambda: None) -> None:
    """Hard-link ``old``'s files into :func:`previous_dir` (fsynced): step 3 of a rewrite.
    ``linked()`` is called after each link (the store's fault point, for tests)."""
    folder = previous_dir(layout, old.prefix)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name in old.files:
        if _own(old.prefix, name):
            try:
                os.link(os.path.join(layout.logdir, name), os.path.join(folder, name))
            except FileNotFoundError:
                pass  # (verified before the rewrite; a file gone since cannot be kept)
            linked()
    fsync_dir(folder)
    fsync_dir(layout.manifests)


def put_back(layout: Layout, prefix: str, new_names: list[str], old_names: Collection[str]) -> None:
    """Undo a rewrite that did not reach its manifest: the kept files renamed back over the new
    ones, a new file the previous checkpoint had not unlinked, the kept folder removed.

    A name of the previous checkpoint (``old_names``) is never unlinked: not kept, it was not
    renamed over either (the renames start once every file is kept), so it is the previous file."""
    folder = previous_dir(layout, prefix)
    kept = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    for name in sorted(kept, key=lambda n: n.endswith(".index")):  # data first, index last, as a commit
        os.rename(os.path.join(folder, name), os.path.join(layout.logdir, name))
    for name in new_names:
        if _own(prefix, name) and name not in kept and name not in old_names:
            try:
                os.unlink(os.path.join(layout.logdir, name))
            except FileNotFoundError:
                pass
    fsync_dir(layout.logdir)
    shutil.rmtree(folder, ignore_errors=True)


def drop_previous(layout: Layout, old: Manifest, new_names: list[str], begun: Callable[[], None] = lambda: None) -> None:
    """After the commit point: unlink the old files the new checkpoint has not, drop the kept folder.
    ``begun()`` is called first (the store's fault point, for tests)."""
    begun()
    for name in old.files:
        if _own(old.prefix, name) and name not in new_names:
            try:
                os.unlink(os.path.join(layout.logdir, name))
            except FileNotFoundError:
                pass
    shutil.rmtree(previous_dir(layout, old.prefix), ignore_errors=True)


def is_rewrite(record: Any) -> TypeGuard[dict[str, Any]]:
    """Whether an intent record is a rewrite's (it names the manifest it replaces)."""
    return isinstance(record, dict) and isinstance(record.get("replaces"), (int, float))


def recover(layout: Layout, prefix: str, record: dict[str, Any]) -> str:
    """At the service's start, for a rewrite's intent record: roll back (the manifest is still the
    one it replaces) or finish (the new one is committed). Returns what was done."""
    current = Manifest.from_json(read_json(manifest_path(layout, prefix)))
    names = [n for n in record.get("files", []) if isinstance(n, str)]
    if current is None or current.committed_at == record["replaces"]:
        put_back(layout, prefix, names, current.files if current is not None else ())
        return f"rolled back the uncommitted rewrite of {prefix}; the previous one is whole"
    folder = previous_dir(layout, prefix)  # the old files the new checkpoint has not go, as drop_previous
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if _own(prefix, name) and name not in current.files:
            try:
                os.unlink(os.path.join(layout.logdir, name))
            except FileNotFoundError:
                pass
    shutil.rmtree(folder, ignore_errors=True)
    return f"finished the rewrite of {prefix}"
