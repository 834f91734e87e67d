"""Commits of one fixed prefix (``numbered=False``) through the checkpoint service's store, in this
process: ``python rewrite_commit.py LOGDIR STEP:SHARDS ...``: each argument one commit of step STEP
with SHARDS data files (each file's bytes say the step). ``STEP:SHARDS:REVISION``: a commit of
``model.ckpt-STEP`` (numbered) of that revision (a newer state of a committed step rewrites it; the
files say the revision too). ``PROCSV_FAULT=checkpoint:<point>:<n>`` kills this process with
SIGKILL at that point of the n-th commit, as it kills the service."""

from __future__ import annotations

import os
import sys

from procsv.common.layout import Layout
from procsv.services.checkpoint.store import CheckpointStore


def writer(step: int, shards: int, revision: str = ""):  # type: ignore[no-untyped-def]
    def write(tmp_prefix: str) -> dict[str, int]:
        for i in range(shards):
            with open(f"{tmp_prefix}.data-{i:05d}-of-{shards:05d}", "w") as fh:
                fh.write(f"data of step {step}{revision}, shard {i}\n" * 100)
        with open(tmp_prefix + ".index", "w") as fh:
            fh.write(f"index of step {step}{revision}\n")
        return {}
    return write


if __name__ == "__main__":
    layout = Layout(sys.argv[1])
    os.makedirs(layout.logdir, exist_ok=True)
    store = CheckpointStore(layout)
    store.recover()
    for arg in sys.argv[2:]:
        step, shards, *revision = (int(x) for x in arg.split(":"))
        store.commit(step=step, reason="periodic", basename="model.ckpt",
                     write=writer(step, shards, f" revision {revision[0]}" if revision else ""),
                     max_to_keep=5, keep_every_n_hours=None, numbered=bool(revision),
                     revision=revision[0] if revision else 0)
        print(f"committed {step}", flush=True)
