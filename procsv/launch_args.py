"""``procsv launch``'s numeric flags and flag combinations checked before anything starts: one line
each, a :class:`UsageError`.

Runs in the process of the ``procsv`` command (:mod:`procsv.cli`), before the watchdog starts.
"""

from __future__ import annotations

import argparse

from procsv.common import env
from procsv.common.errors import UsageError


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse a count, a time or a port out of its range (nan too) with the flag's name and value."""
    for flag, value, low, note in (("--max-restarts", args.max_restarts, 0, ""),
                                   ("--hang-grace-secs", args.hang_grace_secs, 0, ""),
                                   ("--hang-timeout", args.hang_timeout, 0, " (0 turns it off)"),
                                   ("--startup-timeout", args.startup_timeout, 0, " (0 turns it off)")):
        if not value >= low:  # also refuses nan
            raise UsageError(f"{flag} must be >= {low}{note}, not {value:g}")
    if not args.stop_grace_secs > 0:
        raise UsageError(f"--stop-grace-secs must be > 0, not {args.stop_grace_secs:g}")
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
    try:  # the in-memory tier's settings, read from the environment by the watchdog and the trainers
        env.group_snapshot_steps_for()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


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
