"""Where a host's ``--nnodes``, ``--node-rank`` and ``--master-addr`` come from when not given: pure.

Runs in ``procsv launch`` (before it becomes the watchdog or a node agent), reading an environment
mapping it is handed, never ``os.environ`` itself: no clock, no file, no process. What it decides:

* explicit flags win, always;
* inside a Slurm job step (``srun``: ``SLURM_STEP_NUM_NODES``, ``SLURM_NODEID`` and
  ``SLURM_STEP_NODELIST`` are all set), the step's node count, this node's id in the step and the
  first host of the step's node list (expanded as ``scontrol show hostnames`` does), with a port
  derived from the job id; a step of several tasks per node is refused (each would claim the same
  rank). A batch script (no step variables) takes nothing from the allocation;
* in a Kubernetes Indexed Job (``JOB_COMPLETION_INDEX``), that index as the node rank; ``--nnodes``
  must then be given;
* ``PROCSV_MASTER_ADDR`` stands for ``--master-addr`` anywhere (beaten only by the flag);
* the scheduler's job id (``SLURM_JOB_ID``) names the run (status, metrics), in a step or not.

:func:`place` returns the decided values and one line saying what was taken from where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from procsv.common.env import MASTER_ADDR
from procsv.common.errors import UsageError

PORT_BASE, PORT_SPAN = 10000, 20000  # a derived port: 10000 + job id mod 20000 (below Linux's ephemeral range)


@dataclass(frozen=True)
class Placement:
    """This host's place in the job, and the one line saying what came from the scheduler ("": nothing)."""

    nnodes: int
    node_rank: int
    master_addr: Optional[str]
    job_id: Optional[str]  # the scheduler's job id, naming the run
    taken_from: str


def expand_hostlist(text: str) -> list[str]:
    """The hosts of a Slurm host list, in order, as ``scontrol show hostnames`` prints them: comma
    separated items, each with any number of bracket groups of numbers and ranges (``n[01-03,7]``,
    ``rack[1-2]-node[01-02]``; the first group varies slowest); a range whose low end has a leading
    zero is padded to its width. ``ValueError`` for what scontrol calls an invalid host list."""
    hosts: list[str] = []
    for item in _split_items(text):
        expanded = [""]
        rest = item
        while rest:
            m = re.match(r"([^\[\]]*)\[([^\[\]]*)\]", rest)
            if m is None:
                if "[" in rest or "]" in rest:
                    raise ValueError(f"invalid host list {text!r}: unbalanced brackets in {item!r}")
                if rest != item:  # Slurm 22.05's scontrol refuses a suffix after the last bracket group too
                    raise ValueError(f"invalid host list {text!r}: text after the last bracket in {item!r}")
                expanded = [e + rest for e in expanded]
                break
            expanded = [e + m.group(1) + n for e in expanded for n in _numbers(m.group(2), text)]
            rest = rest[m.end():]
        hosts.extend(expanded)
    return hosts


def _split_items(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += 1 if ch == "[" else -1 if ch == "]" else 0
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if any(not it.strip() for it in items):
        raise ValueError(f"invalid host list {text!r}: an empty item")
    return [it.strip() for it in items]


def _numbers(group: str, text: str) -> list[str]:
    out: list[str] = []
    for part in group.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"invalid host list {text!r}: {part!r} is not a number or a range")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"invalid host list {text!r}: the range {part!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(first, last + 1))
    return out


def derived_port(job_id: str) -> int:
    """node 0's port when ``--master-addr`` is not given: from the job id, the same on every host."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def place(env: Mapping[str, str], nnodes: Optional[int], node_rank: Optional[int],
          master_addr: Optional[str]) -> Placement:
    """The values of ``--nnodes``, ``--node-rank`` and ``--master-addr`` (``None``: not given) with what
    ``env`` adds; raises :class:`UsageError` (one line) for a scheduler setting procsv cannot use."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None
    taken: list[str] = []
    addr = master_addr
    if addr is None and env.get(MASTER_ADDR):
        addr = env[MASTER_ADDR]
        taken.append(f"--master-addr {addr} ({MASTER_ADDR})")
    step = all(env.get(k) for k in ("SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_STEP_NODELIST"))
    where = ""
    if step:
        where = f"the Slurm step ({job}.{env.get('SLURM_STEP_ID', '?')})"
        nodes_raw, tasks = env["SLURM_STEP_NUM_NODES"], env.get("SLURM_STEP_NUM_TASKS", "")
        if not nodes_raw.isdigit() or not env["SLURM_NODEID"].isdigit():
            raise UsageError(f"SLURM_STEP_NUM_NODES={nodes_raw!r} and SLURM_NODEID={env['SLURM_NODEID']!r} must be "
                             "numbers; give --nnodes and --node-rank")
        if tasks.isdigit() and int(tasks) != int(nodes_raw) and (nnodes is None or node_rank is None):
            raise UsageError(f"the Slurm step runs {tasks} tasks on {nodes_raw} nodes: run one `procsv launch` per "
                             "node (srun --ntasks-per-node=1; --nproc N starts N trainers on each), or give --nnodes "
                             "and --node-rank")
        if nnodes is None:
            nnodes = int(nodes_raw)
            taken.append(f"--nnodes {nnodes} (SLURM_STEP_NUM_NODES)")
        if node_rank is None:
            node_rank = int(env["SLURM_NODEID"])
            taken.append(f"--node-rank {node_rank} (SLURM_NODEID)")
        if addr is None and nnodes > 1:
            try:
                first = expand_hostlist(env["SLURM_STEP_NODELIST"])[0]
            except ValueError as exc:
                raise UsageError(f"SLURM_STEP_NODELIST: {exc}; give --master-addr HOST:PORT") from None
            if job is None or not job.isdigit():
                raise UsageError("no numeric SLURM_JOB_ID to derive node 0's port from; give --master-addr HOST:PORT")
            addr = f"{first}:{derived_port(job)}"
            taken.append(f"--master-addr {addr} (the first host of SLURM_STEP_NODELIST "
                         f"{env['SLURM_STEP_NODELIST']}, the port from the job id)")
    elif env.get("JOB_COMPLETION_INDEX"):
        where = "the Kubernetes Indexed Job"
        index = env["JOB_COMPLETION_INDEX"]
        if node_rank is None:
            if not index.isdigit():
                raise UsageError(f"JOB_COMPLETION_INDEX={index!r} is not a number; give --node-rank")
            node_rank = int(index)
            taken.append(f"--node-rank {node_rank} (JOB_COMPLETION_INDEX)")
        if nnodes is None:
            raise UsageError("in a Kubernetes Indexed Job (JOB_COMPLETION_INDEX is set) give --nnodes: the Job's "
                             "completions (and parallelism)")
    line = ""
    if taken:
        line = f"procsv: from {where or 'the environment'}: " + ", ".join(taken)
    return Placement(nnodes if nnodes is not None else 1, node_rank if node_rank is not None else 0, addr, job, line)
