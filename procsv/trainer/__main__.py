"""Entry point of the trainer process: ``python -m procsv.trainer TARGET [ARGS...]``.

Runs in the trainer. Runs TARGET (a module name, or a path to a .py file) as ``__main__`` with
ARGS as its ``sys.argv[1:]``, exactly as ``python -m TARGET`` / ``python TARGET`` would. Before
that it arms the parent-death signal, takes the death-notice mutex and catches an early SIGTERM;
if TARGET raises, it writes the traceback to this attempt's error file (the watchdog prints it as
the root cause) and exits non-zero. A run that a SIGTERM/SIGINT stopped after its emergency
checkpoint exits with :data:`procsv.common.exitcodes.EXIT_PREEMPTED` (42) and first writes its
exit report saying so (``<runtime dir>/trainer.<attempt>.exit.json``); the watchdog treats a 42
with that report as "saved, restart me" unless it asked for the stop itself, and any other 42 (the
program's own ``sys.exit(42)``) as a failure. What the program's Supervisors achieved arrives as a
value (:mod:`procsv.trainer.outcome`).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Optional

from procsv.common import bootstrap, lossyio
from procsv.common.layout import exit_report_file, write_json
from procsv.common.exitcodes import EXIT_DIVERGING, EXIT_GROUP_ROLLBACK, EXIT_PREEMPTED
from procsv.trainer import outcome
from procsv.trainer.ends import deathnotice, predecessors
from procsv import cluster
from procsv.trainer.group import chief_listening, heartbeat_bound
from procsv.trainer.standby import priority, servers
from procsv.trainer.standby import wait as standby_wait


def main() -> int:
    lossyio.install()  # a line printed on a full disk is dropped (counted), not the trainer's death
    bootstrap.die_with_parent()
    config = bootstrap.read_config()  # what runs before the program (each Supervisor reads its own: the program's)
    deathnotice.hold(config.death_mutex)  # released only on a clean exit: any other death is noticed at once
    outcome.catch_early_stop()
    if config.standby:  # prepared while the trainer trains: only on CPU the trainer leaves idle
        standby_wait.stand_by()
        lowered = priority.lower()
        print(f"procsv: standby preparing at {'idle (SCHED_IDLE)' if lowered else 'normal'} CPU priority"
              + ("" if lowered else " (SCHED_IDLE could not be undone at promotion without CAP_SYS_NICE)"),
              flush=True)
        servers.guard()  # the program's own tf.train.Server on the trainer's port: no standby for this run
    elif config.audit is not None:  # an auditor (issue 71): on CPU the trainer leaves idle, the whole time
        idle = priority.idle_for_good()
        print(f"procsv: auditor of steps {config.audit[0]}-{config.audit[1]} at "
              f"{'idle (SCHED_IDLE)' if idle else 'normal (SCHED_IDLE refused)'} CPU priority", flush=True)
    else:  # the trainer processes this one replaces released what they held (a port, a lock) before the program runs
        predecessors.wait_gone(config.predecessors)
    if len(sys.argv) < 2:
        print("usage: python -m procsv.trainer TARGET [ARGS...]", file=sys.stderr)
        return 2
    target, args = sys.argv[1], sys.argv[2:]
    ctx = bootstrap.ChildContext.from_config(config)
    heartbeat_bound.configure(config.place)  # a group's: a suspension of the job is no member's death
    # a worker's chief's server up before its program: waited for once TensorFlow is imported (configure's import,
    # seconds in a fresh process; before, the wait came first, and a fresh worker's import began only once its chief
    # listened, after the chief's own import and strategy)
    if not (config.standby or config.audit is not None) and config.in_group and config.place.rank > 0 \
            and not config.place.ps:
        chief = chief_listening.chief_address(cluster.tf_config())
        if chief is not None:
            chief_listening.wait_listening(chief)
    is_path = target.endswith(".py") or os.sep in target
    sys.argv = [os.path.abspath(target) if is_path else target, *args]
    try:
        if is_path:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
        else:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code == EXIT_PREEMPTED and outcome.collect().preempted:
            return _clean_exit(ctx)  # the program's own 42 after procsv's preemption commit: one, truly
        if exc.code not in (0, None):
            done = outcome.collect()
            bootstrap.write_error_file(ctx, exc, done.phase, done.steps_completed, done.committed)
            if exc.code in (EXIT_DIVERGING, EXIT_GROUP_ROLLBACK):
                deathnotice.release()  # a deliberate stop (final, or a group's rollback): its exit status is judged
            raise
        return _clean_exit(ctx)
    except BaseException as exc:
        done = outcome.collect()
        bootstrap.write_error_file(ctx, exc, done.phase, done.steps_completed, done.committed)
        raise
    return _clean_exit(ctx)


def _report_exit(ctx: Optional[bootstrap.ChildContext], result: outcome.Outcome) -> None:
    """Tell the watchdog that this exit with 42 is a preemption: a SIGTERM/SIGINT stopped the
    program and its checkpoint committed (the exit report, atomic, read at the reap). Without it
    the watchdog judges a 42 as a failure (a program's own ``sys.exit(42)``)."""
    report = outcome.exit_report(result, os.getpid(), ctx.role, ctx.attempt) if ctx is not None else None
    if report is None or ctx is None or not ctx.supervised:
        return
    try:
        write_json(exit_report_file(ctx.endpoints.runtime_dir, ctx.role, ctx.attempt), report)
    except OSError as err:
        print(f"procsv: could not write the exit report ({err}): the watchdog will count this preemption as a "
              "failure", file=sys.stderr, flush=True)


def _clean_exit(ctx: Optional[bootstrap.ChildContext]) -> int:
    result = outcome.collect()
    if result.stopped_by_signal and result.unsaved:
        print("procsv: stopped by a signal, but the emergency checkpoint did not commit: exiting with code "
              f"{outcome.EXIT_UNSAVED} (a failure), not {EXIT_PREEMPTED} (saved)", file=sys.stderr, flush=True)
    elif result.unsaved:
        print("procsv: the program finished, but its final checkpoint did not commit: exiting with code "
              f"{outcome.EXIT_UNSAVED} (a failure), not 0, so that its last steps are not reported saved; a restart "
              "resumes from the newest committed checkpoint", file=sys.stderr, flush=True)
    code = result.clean_exit_code
    if code == EXIT_PREEMPTED:
        _report_exit(ctx, result)  # before the release: the watchdog may reap us right after it
    deathnotice.release()
    return code


def deaf_at_exit() -> None:
    """The program has ended: a SIGTERM now (the watchdog's stop resent every ``stop_resend_secs`` to a
    group's worker, a second job-wide one) has nothing left to stop. Python puts a signal's default
    action back where a Python handler was at its finalization, before the modules are torn down
    (1.7 s with TensorFlow here): such a SIGTERM then killed the process, and its exit 0 (or 42 with its
    report) became a death by SIGTERM. Ignored, it changes nothing. (A trainer forked from the zygote
    ends with ``os._exit``, after its non-daemon threads and ``atexit`` handlers: no teardown, and it
    calls this first too, as the program's end.)"""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    try:
        code = main()
    finally:
        deaf_at_exit()
    sys.exit(code)
