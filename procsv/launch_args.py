"""``procsv launch``'s numeric flags and flag combinations checked before anything starts: one line
each, a :class:`UsageError`.

Runs in the process of the ``procsv`` command (:mod:`procsv.cli`), before the watchdog starts.
"""

from __future__ import annotations

import argparse
from typing import Mapping, Optional

from procsv.common import env
from procsv.common.errors import UsageError


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse a count, a time or a port out of its range (nan too) with the flag's name and value."""
    for flag, value, low, note in (("--max-restarts", args.max_restarts, 0, ""),
                                   ("--hang-grace-secs", args.hang_grace_secs, 0, ""),
                                   ("--hang-timeout", args.hang_timeout, 0, " (0 turns it off)"),
                                   ("--startup-timeout", args.startup_timeout, 0, " (0 turns it off)"),
                                   ("--stuck-secs", args.stuck_secs, 0, " (0 turns it off)")):
        if not value >= low:  # also refuses nan
            raise UsageError(f"{flag} must be >= {low}{note}, not {value:g}")
    if not args.stop_grace_secs > 0:
        raise UsageError(f"--stop-grace-secs must be > 0, not {args.stop_grace_secs:g}")
    if args.suspect_after < 1:
        raise UsageError(f"--suspect-after must be >= 1, not {args.suspect_after}")
    if args.keep_logs < 1:
        raise UsageError(f"--keep-logs must be >= 1, not {args.keep_logs}")
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be a port number from 1 to 65535, not {args.metrics_port}")
    if args.metrics_host is not None and args.metrics_port is None:
        raise UsageError("--metrics-host needs --metrics-port")
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, not {args.nproc}")
    if not args.group_grace_secs >= 0:
        raise UsageError(f"--group-grace-secs must be >= 0, not {args.group_grace_secs:g}")
    if not args.logdir_timeout > 0:
        raise UsageError(f"--logdir-timeout must be > 0, not {args.logdir_timeout:g}")
    if not args.node_timeout > 0:
        raise UsageError(f"--node-timeout must be > 0, not {args.node_timeout:g}")
    if not args.rejoin_timeout > 0:
        raise UsageError(f"--rejoin-timeout must be > 0, not {args.rejoin_timeout:g}")
    if args.max_skips < 0:
        raise UsageError(f"--max-skips must be >= 0, not {args.max_skips}")
    if args.skip_window < 1:
        raise UsageError(f"--skip-window must be >= 1, not {args.skip_window}")


def group_snapshot_steps(environ: Mapping[str, str]) -> int:
    """The K the watchdog hands a trainer group's members (:func:`procsv.common.env.group_snapshot_steps_for`)
    from the launch's environment ``environ`` (its ``PROCSV_MEMORY_SNAPSHOTS`` and
    ``PROCSV_GROUP_SNAPSHOT_STEPS``, which the trainers inherit and read too); a bad value is a
    :class:`UsageError` before anything starts."""
    try:
        return env.group_snapshot_steps_for(environ.get(env.MEMORY_SNAPSHOTS, ""),
                                            environ.get(env.GROUP_SNAPSHOT_STEPS, ""))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_min_nodes(min_nodes: Optional[int], nnodes: int, ps: int) -> None:
    """``--min-nodes K`` (an elastic group, :mod:`procsv.watchdog.rules.membership`): from 1 to ``--nnodes``,
    and not with ``--ps`` (its tasks are placed on every host, each restarted alone), nor on one host (no
    ``--nnodes``, or 1: no host can leave the group; the flag would be ignored in silence)."""
    if min_nodes is None:
        return
    if nnodes <= 1:
        raise UsageError(f"--min-nodes needs --nnodes M > 1 (a group over hosts that trains on without some); this "
                         f"launch is one host (--nnodes {nnodes})")
    if not 1 <= min_nodes <= nnodes:
        raise UsageError(f"--min-nodes must be from 1 to --nnodes ({nnodes}), not {min_nodes}")
    if ps:
        raise UsageError("--min-nodes is for a --nproc group over --nnodes hosts; --ps tasks are placed on every "
                         "host and restarted alone (leave --min-nodes out)")


def check_coordinator(coordinator: bool, ps: int, nnodes: int = 1) -> None:
    """Refuse ``--coordinator`` without ``--ps N --workers M``: it names the mode of a parameter-server
    cluster (TF2 ``ParameterServerStrategy``, TARGET once as the chief) and means nothing alone; and
    with ``--nnodes`` (its servers run on one host)."""
    if coordinator and nnodes > 1:
        raise UsageError("--coordinator runs every task on this host; --nnodes is supported with --ps in TF1 mode "
                         "only (without --coordinator)")
    if coordinator and ps <= 0:
        raise UsageError("--coordinator needs --ps N --workers M (TF2 ParameterServerStrategy: N parameter "
                         "servers and M workers that procsv starts, TARGET runs once as the chief)")


def add_host_flags(la: argparse.ArgumentParser) -> None:
    """``procsv launch``'s flags of a job over hosts (``--nnodes`` and what goes with it)."""
    la.add_argument("--nnodes", type=int, default=None, metavar="M",
                    help="hosts of the job: run `procsv launch` on each with the same TARGET, --logdir (a "
                         "shared filesystem), --nproc, --nnodes and --master-addr, and its own --node-rank; "
                         "node 0 decides for all (default 1; in a Slurm step, SLURM_STEP_NUM_NODES)")
    la.add_argument("--node-rank", type=int, default=None, metavar="R",
                    help="this host's rank, 0 to M-1 (default 0; in a Slurm step SLURM_NODEID, in a Kubernetes "
                         "Indexed Job JOB_COMPLETION_INDEX)")
    la.add_argument("--master-addr", default=None, metavar="HOST:PORT",
                    help="with --nnodes: where node 0 listens for the other hosts (TCP, encrypted and "
                         "authenticated with CURVE keys it writes to the logdir; default PROCSV_MASTER_ADDR, "
                         "in a Slurm step the step's first host and a port from the job id)")
    la.add_argument("--rejoin-timeout", type=float, default=300.0, metavar="SECS",
                    help="with --nnodes: how long a lost (or not yet joined) host may take to come back before "
                         "the run stops and fails; with --min-nodes K, how long fewer than K hosts (or a host absent "
                         "at the start) are waited for (default 300)")
    la.add_argument("--min-nodes", type=int, default=None, metavar="K",
                    help="with --nnodes M: an elastic group. A host found lost (or absent past --rejoin-timeout) no "
                         "longer stops the run while K hosts are left: the group restarts at once on the hosts left and "
                         "trains on, and takes the host back at the next checkpoint once its agent returns (default M: "
                         "every host is needed; docs/elastic.md)")
    la.add_argument("--node-timeout", type=float, default=15.0, metavar="SECS",
                    help="with --nnodes: node 0 finds a host lost when its agent is silent this long (one whose "
                         "host's kernel is silent too, to node 0's probes: within 0.5 s), and every "
                         "agent stops its trainers when node 0 is silent this long (node 0's value: it sends it "
                         "to the agents) (default 15)")
