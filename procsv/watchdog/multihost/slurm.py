"""Slurm's commands as ``procsv launch`` uses them: ``KillWait`` and ``scontrol requeue``.

Runs in ``procsv launch`` (the watchdog of node 0), before its loop starts (:func:`kill_wait`: one
bounded ``scontrol show config``) and after it ended (:func:`requeue`: once, after the run stopped
in order on ``--preempt-signal``), never inside the loop. :func:`parse_kill_wait`,
:func:`grace_warning` and :func:`parse_preempt_signal` (the flag's value) are pure.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from typing import Callable, Optional

from procsv.common.errors import UsageError
from procsv.watchdog.rules.judge import EXIT_STOP_UNSAVED

SCONTROL_TIMEOUT = 10.0  # seconds a call of scontrol may take (a controller that does not answer)


def parse_kill_wait(config: str) -> Optional[int]:
    """``KillWait`` in seconds from ``scontrol show config``'s text (``KillWait = 30 sec``), else None."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", config, re.MULTILINE)
    return int(m.group(1)) if m else None


def grace_warning(stop_grace_secs: float, kill_wait: Optional[int]) -> str:
    """The one warning line when the stop's grace outlasts Slurm's SIGTERM-to-SIGKILL interval ("": none)."""
    if kill_wait is None or stop_grace_secs <= kill_wait:
        return ""
    return (f"procsv: warning: --stop-grace-secs {stop_grace_secs:g} is longer than Slurm's KillWait ({kill_wait} s): "
            f"a scancel, requeue or preemption SIGKILLs every process of the job {kill_wait} s after its SIGTERM, "
            f"so a checkpoint still being written then is lost; give --stop-grace-secs {kill_wait} or less (or ask "
            "for a longer KillWait)")


def warn_grace(stop_grace_secs: float, job_id: Optional[str]) -> None:
    """Inside a Slurm job (``job_id``), print :func:`grace_warning` for its cluster's KillWait, if any."""
    if not job_id:
        return
    warning = grace_warning(stop_grace_secs, kill_wait())
    if warning:
        print(warning, file=sys.stderr, flush=True)


def kill_wait() -> Optional[int]:
    """This cluster's ``KillWait`` (None where scontrol is missing, fails or does not answer in time)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_kill_wait(out.stdout) if out.returncode == 0 else None


def after_run(code: int, preempt_signal: int, requeue_on_preempt: bool, job_id: Optional[str],
              stopped_by: Callable[[], Optional[int]] = lambda: None) -> int:
    """After node 0's loop ended with ``code``: with ``--requeue-on-preempt``, a stop on the preempt
    signal requeues the job (once, saying so); returns ``code``. So does a stop on it (``stopped_by()``:
    the signal the watchdog stopped on, asked only then) whose checkpoint of the last step did not commit (exit
    :data:`EXIT_STOP_UNSAVED`): the newest committed checkpoint is intact and the requeued job
    resumes there, where not requeuing would end an unattended run for good."""
    unsaved = code == EXIT_STOP_UNSAVED and stopped_by() == preempt_signal
    if requeue_on_preempt and (code == 128 + preempt_signal or unsaved) and job_id:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue's own SIGTERM: the run is over, say it
        print(requeue(job_id)[1], file=sys.stderr, flush=True)  # the run stopped and released its logdir
    return code


def requeue(job_id: str) -> tuple[bool, str]:
    """Run ``scontrol requeue JOB`` once; (whether it succeeded, the line that says so)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return False, f"procsv: error: --requeue-on-preempt: no scontrol on PATH; job {job_id} was not requeued"
    try:
        out = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"procsv: error: --requeue-on-preempt: `scontrol requeue {job_id}` failed ({exc}); not requeued"
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit code {out.returncode}"]
        return False, f"procsv: error: --requeue-on-preempt: `scontrol requeue {job_id}` failed: {why[0]}"
    return True, (f"procsv: --requeue-on-preempt: ran `scontrol requeue {job_id}`: Slurm starts the job again, "
                  "which resumes from the newest committed checkpoint")


# signals that cannot be a --preempt-signal: uncatchable, already a stop, procsv's own (USR1 promotes a
# hot standby), or the kernel's for faults and children
_NOT_PREEMPT = {"KILL", "STOP", "TERM", "INT", "USR1", "CHLD", "SEGV", "BUS", "FPE", "ILL", "ABRT", "TRAP", "PIPE",
                "CONT", "TSTP", "TTIN", "TTOU"}


def parse_preempt_signal(text: str, requeue_on_preempt: bool = False, job_id: Optional[str] = None) -> int:
    """``--preempt-signal``'s value (``USR2``, ``SIGUSR2`` or ``12``) as a signal number; UsageError otherwise,
    and for ``--requeue-on-preempt`` outside a Slurm job (no ``job_id``)."""
    if requeue_on_preempt and not job_id:
        raise UsageError("--requeue-on-preempt requeues the Slurm job this launch runs in, and SLURM_JOB_ID is not "
                         "set: run it inside a Slurm job (sbatch), or leave the flag out")
    name = text.strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    try:
        sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals["SIG" + name]
    except (KeyError, ValueError):
        raise UsageError(f"--preempt-signal {text!r} is not a signal name (e.g. USR2, HUP, XCPU)") from None
    if sig.name[3:] in _NOT_PREEMPT:
        raise UsageError(f"--preempt-signal {sig.name[3:]} cannot be used: pick a signal procsv does not use itself "
                         "(USR2, the default; HUP, XCPU, URG, ...)")
    return int(sig)
