"""Several plain reference runs (a test program run as ``python PROGRAM ARGS``, no watchdog) made in
one Python process, one TensorFlow import for all of them instead of one each (about 2 s of CPU
apiece): for test modules that compare their launches bit for bit with several plain runs.

Each program runs as its ``__main__`` (``runpy``), in the order given, as a new program: before each,
procsv's process-wide state a program's first ``procsv.train`` or warning sets is cleared, and so is
Keras' (its session, the global dtype policy a mixed precision program sets); each program seeds its
own randomness (``keras.utils.set_random_seed``) as it does in a process of its own. A program that
turns eager execution off must come last. The tests' bit-equality to the launches is what shows the
runs equal their one-process-each twins."""

from __future__ import annotations

import json
from typing import Optional, Sequence

from pyfork import ForkedRun, run_python

_DRIVER = """
import json, runpy, sys
from procsv.trainer import once
from procsv.trainer.monitored import hooks
for program, argv in json.loads(sys.argv[1]):
    hooks.set_global_step(None)  # each program is a new one for procsv.train, as in a process of its own
    once._warned.clear()
    if "keras" in sys.modules:
        import keras
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")
    sys.argv = [program, *argv]
    print(f"plain run: {sys.argv}", flush=True)
    runpy.run_path(program, run_name="__main__")
"""


def run_plain_programs(runs: Sequence[tuple[str, Sequence[str]]], env: dict[str, str], cwd: Optional[str] = None,
                       timeout: float = 900) -> ForkedRun:
    """Run every ``(program, argv)`` of ``runs`` in order in one Python process (with ``env``), as
    ``python program *argv`` each; fails with the process's output unless all of them succeed (returned:
    what they said)."""
    done = run_python(["-c", _DRIVER, json.dumps([(p, list(a)) for p, a in runs])], env=env, timeout=timeout,
                      cwd=cwd)  # (forked from the fork server: its TensorFlow import is shared too)
    assert done.returncode == 0, done.stdout + done.stderr
    return done
