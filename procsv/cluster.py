"""This trainer's place in its group: ``procsv launch --nproc N`` runs N trainers, task 0 the chief.

Runs in the trainer (the user's program reads it). The launch gives every trainer of a group its
own ``TF_CONFIG`` (the cluster's addresses on free ports procsv chose, and this trainer's task),
which ``tf.distribute.MultiWorkerMirroredStrategy`` reads by itself; these functions say the same
for a program that needs its task without parsing ``TF_CONFIG``. Without ``--nproc`` (or in plain
``python train.py``) there is one trainer: rank 0 of 1, the chief.
"""

from __future__ import annotations

import json
import os
from typing import Any

from procsv.common import env


def rank() -> int:
    """This trainer's task index in the group (0: the chief, which saves and writes summaries)."""
    return int(os.environ.get(env.RANK, "0") or 0)


def nproc() -> int:
    """How many trainers the group has (1 without ``--nproc``)."""
    return int(os.environ.get(env.NPROC, "1") or 1)


def is_chief() -> bool:
    """Whether this trainer is the group's chief: what ``Supervisor(is_chief=...)`` defaults to."""
    return rank() == 0


def tf_config() -> dict[str, Any]:
    """The parsed ``TF_CONFIG`` the launch gave this trainer (``{}`` when it gave none)."""
    raw = os.environ.get("TF_CONFIG", "")
    try:
        parsed = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def make_tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of task ``index`` of a worker cluster at ``addresses`` (task 0 the chief)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


__all__ = ["rank", "nproc", "is_chief", "tf_config", "make_tf_config"]
