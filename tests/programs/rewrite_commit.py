"""Commits of one fixed prefix (``numbered=False``) through the checkpoint service's store, in this
process: ``python rewrite_commit.py LOGDIR STEP:SHARDS ...``: each argument one commit of step STEP
with SHARDS data files (each file's bytes say the step). ``PROCSV_FAULT=checkpoint:<point>:<n>``
kills this process with SIGKILL at that point of the n-th commit, as it kills the service."""

from __future__ import annotations

import os
import sys

from procsv.common.layout import Layout
from procsv.services.checkpoint.store import CheckpointStore


def writer(step: int, shards: int):  # type: ignore[no-untyped-def]
    def write(tmp_prefix: str) -> dict[str, int]:
        for i in range(shards):
            with open(f"{tmp_prefix}.data-{i:05d}-of-{shards:05d}", "w") as fh:
                fh.write(f"data of step {step}, shard {i}\n" * 100)
        with open(tmp_prefix + ".index", "w") as fh:
            fh.write(f"index of step {step}\n")
        return {}
    return write


if __name__ == "__main__":
    layout = Layout(sys.argv[1])
    os.makedirs(layout.logdir, exist_ok=True)
    store = CheckpointStore(layout)
    store.recover()
    for arg in sys.argv[2:]:
        step, shards = (int(x) for x in arg.split(":"))
        store.commit(step=step, reason="periodic", basename="model.ckpt", write=writer(step, shards),
                     max_to_keep=5, keep_every_n_hours=None, numbered=False)
        print(f"committed {step}", flush=True)
