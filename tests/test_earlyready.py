"""A forked trainer's ready message read before the zygote's answer named its pid (pure).

At load the watchdog read a restarted trainer's ``TrainerReady`` before the zygote's ``ForkReply``
(both ready in one poll, the message socket first, or the zygote not scheduled in between): the view
did not know the pid, the message was dropped and never sent again, and ``status.json`` said
``restored_step: null`` after a restart that had restored
(tests/test_monitored.py::test_stop_at_step_num_steps_is_exact_after_a_sigkill_of_the_trainer at load).
"""

from __future__ import annotations

from procsv.ipc.messages import Progress, StandbyReady, TrainerReady
from procsv.watchdog import observe
from procsv.watchdog.earlyready import EarlyReady
from procsv.watchdog.rules.state import RunView, TRAINER

CKPT = "/run/model.ckpt-20"


def _ready(pid: int) -> TrainerReady:
    return TrainerReady(pid, 2, 20, CKPT, 0.1, [], None, None)


def test_a_ready_read_before_the_fork_reply_is_observed_once_the_reply_names_its_pid() -> None:
    view, early = RunView(launch_start=0.0), EarlyReady()
    observe.heard(view, _ready(300), 1.0)  # what the watchdog did: the pid unknown yet, the message lost
    assert view.restored_step is None
    assert early.hold(_ready(300), set(), forking=True)  # now: held while the fork is pending
    assert early.release(set(), forking=True) == []  # not named yet: still held
    observe.spawned(view, TRAINER, TRAINER, 2, 300, 1.1, "zygote")  # the ForkReply
    (msg,) = early.release({300}, forking=False)
    observe.heard(view, msg, 1.1)
    assert view.restored_step == 20 and view.children[TRAINER].ready_at == 1.1


def test_only_a_ready_message_from_an_unknown_pid_during_a_fork_is_held_and_the_rest_dropped_after_it() -> None:
    early = EarlyReady()
    assert not early.hold(_ready(300), {300}, forking=True)  # known: observed at once
    assert not early.hold(_ready(301), set(), forking=False)  # no fork pending: dropped as before
    assert not early.hold(Progress(302, 5, 0.0, ""), set(), forking=True)  # sent again at every step
    assert early.hold(StandbyReady(303, 3, 1.0), set(), forking=True)
    assert early.hold(_ready(304), set(), forking=True)
    assert early.release({304}, forking=True) == [_ready(304)]
    assert early.release(set(), forking=False) == []  # the fork answered with another pid: 303 is no child
    assert early.release({303}, forking=False) == []
