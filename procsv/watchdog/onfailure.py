"""``procsv launch --on-failure CMD``: a command of the user's, run once when the run fails.

Runs in the watchdog, at the very end of a run that ended ``failed`` (the trainer kept failing,
failed at start-up, checkpoints kept failing, the logdir was lost, an internal error): every
child is gone and the status file and report are written, so CMD can read them. CMD runs through
``/bin/sh -c`` with the watchdog's environment plus ``PROCSV_LOGDIR``, ``PROCSV_EXIT_CODE``,
``PROCSV_RUN_STATE`` and ``PROCSV_ROOT_CAUSE`` (one line), for up to ``TIMEOUT`` seconds, its
output on the launch's. Whatever CMD does, the launch's exit code stays the run's.
"""

from __future__ import annotations

import os
import subprocess
from typing import Callable, Optional

from procsv.common import env

TIMEOUT = 60.0  # seconds CMD may take before it is killed


def hook_env(logdir: str, exit_code: int, state: str, root_cause: Optional[str]) -> dict[str, str]:
    """The environment CMD runs with (pure, but for the inherited one)."""
    out = {k: v for k, v in os.environ.items() if k not in env.ALL}
    out.update({env.LOGDIR: logdir, env.EXIT_CODE: str(exit_code), env.RUN_STATE: state,
                env.ROOT_CAUSE: " ".join((root_cause or "unknown").split())})
    return out


def run_on_failure(cmd: str, logdir: str, exit_code: int, state: str, root_cause: Optional[str],
                   say: Callable[[str], None], timeout: float = TIMEOUT) -> None:
    say(f"procsv: the run failed: running --on-failure command: {cmd}")
    try:
        done = subprocess.run(["/bin/sh", "-c", cmd], env=hook_env(logdir, exit_code, state, root_cause),
                              stdin=subprocess.DEVNULL, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        say(f"procsv: the --on-failure command did not finish within {timeout:g} s and was killed")
        return
    except OSError as exc:
        say(f"procsv: the --on-failure command could not be run: {exc}")
        return
    if done.returncode != 0:
        say(f"procsv: the --on-failure command exited with code {done.returncode}")
