"""A hot standby and what only one process may hold: the program's own ``tf.train.Server``.

Runs in a hot standby's process (:mod:`procsv.trainer.__main__` guards it before the program runs;
:mod:`procsv.trainer.standby.wait` releases the guard at the promotion). A standby runs the program up to
its Supervisor's session, so a program that starts its own ``tf.distribute.Server`` first (TensorFlow's
``mnist_replica``: between-graph replication, a server per task on the port its cluster names) starts it
again in the standby, on the port the live trainer holds: TensorFlow's "Could not start gRPC server" ended
the standby, five in a row, before procsv stopped preparing them. Guarded, that failure ends the standby
with ``EXIT_NO_STANDBY`` after one line, and the watchdog prepares no standby for the rest of the run. A
server on a port of its own (a standby group's members, on the next attempt's ``TF_CONFIG``) starts as usual.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from procsv.common.exitcodes import EXIT_NO_STANDBY

_BIND_FAILED = "Could not start gRPC server"  # TensorFlow's message for a server whose port is taken
_original: Optional[Callable[..., None]] = None


def guard() -> None:
    """From now on, a ``tf.distribute.Server`` this process cannot start for its port ends it with
    ``EXIT_NO_STANDBY`` (any other failure of the server is raised as it was)."""
    global _original
    from tensorflow.python.training import server_lib

    if _original is not None:
        return
    original = _original = server_lib.Server.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (TF's UnknownError; only the bind failure is ours)
            if _BIND_FAILED not in str(exc):
                raise
            print(f"procsv: this hot standby cannot start the program's own tf.train.Server ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}): its port is the live trainer's; the run will have "
                  "no hot standby", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_NO_STANDBY) from exc

    server_lib.Server.__init__ = init


def release() -> None:
    """The standby was promoted: a server it starts from now on is the trainer's, failing as TF's does."""
    global _original
    if _original is None:
        return
    from tensorflow.python.training import server_lib

    server_lib.Server.__init__ = _original
    _original = None
