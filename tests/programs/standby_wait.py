"""A hot standby's wait without TensorFlow or a launch: ``standby_wait.py forked|plain``.

``forked``: this process plays the zygote: it blocks the stop signals and SIGUSR1, as the zygote
does for a standby, and forks the standby, which waits; its watchdog is this process's parent, the
test, named in its ``PROCSV_PARENT_PID`` as the zygote names its own parent (the re-parenting to the
watchdog, a child subreaper, is left out: the standby stays this process's child). ``plain``: this process itself waits with nothing blocked (a standby not forked by a
zygote). The standby prints ``standby <pid>`` first, then the wait's own lines; promoted, it
prints ``promoted`` and exits 0 (the zygote exits with its code)."""

from __future__ import annotations

import os
import sys
import tempfile

from procsv.common import stopfrom
from procsv.common.bootstrap import ChildContext, read_config
from procsv.common.layout import Layout
from procsv.ipc.transport import Endpoints
from procsv.trainer.standby.wait import wait_for_promotion


def standby() -> int:
    print(f"standby {os.getpid()}", flush=True)
    here = tempfile.gettempdir()
    wait_for_promotion(ChildContext(Layout(here), Endpoints(here), "trainer", 2, supervised=False, config=read_config()))
    print("promoted", flush=True)
    return 0


def main() -> int:
    if sys.argv[1] == "plain":
        return standby()
    stopfrom.block(stopfrom.STOP_SIGNALS + (stopfrom.PROMOTE,))
    os.environ["PROCSV_PARENT_PID"] = str(os.getppid())
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = standby()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
