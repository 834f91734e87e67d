"""A node agent's share of a standby group over hosts: the promotion of its standby members (issue 70).

Runs in the node agent (:mod:`procsv.watchdog.multihost.agent`) of hosts 1..M-1. Node 0's watchdog decides
(:mod:`procsv.watchdog.rules.standby`, rule 10) to prepare a standby group over the group's hosts; each agent
starts its share (a :class:`~procsv.ipc.messages.StartMembers` with ``standby``: slots ``standby<R>``, forked
from its own pre-warmed trainer, waiting at idle CPU priority) and relays their
:class:`~procsv.ipc.messages.StandbyReady`. At a member's death node 0 promotes the group whole, every host's
members in the same round: its own as on one host, each other host's by a :class:`PromoteMember` to its
agent, which does here what node 0's executor does for its own (:meth:`Executor._promote
<procsv.watchdog.executor.Executor._promote>`): the member is known as the attempt's ``worker<R>`` from then
on, set back to normal CPU priority, its :class:`~procsv.ipc.messages.Promotion` written (whole, not durable:
read by a live process) to this agent's runtime directory, and woken by SIGUSR1 from this agent, its parent
(the one sender a standby obeys). A member already gone is not promoted: its end, reported under its standby
slot, is taken by node 0 as the promoted worker's (:meth:`RemoteMembers.ended
<procsv.watchdog.multihost.remote.RemoteMembers.ended>`).
"""

from __future__ import annotations

import signal

from procsv.common.layout import atomic_write, promotion_file
from procsv.ipc.codec import encode
from procsv.ipc.messages import PromoteMember, Promotion
from procsv.watchdog.children import ChildProcess
from procsv.watchdog.rules.group import rank_of, worker_slot


def promote(members: dict[str, ChildProcess], runtime_dir: str, msg: PromoteMember) -> bool:
    """Promote standby member ``msg.slot`` of ``members`` (keyed ``slot.attempt``) to worker R of its attempt:
    re-keyed, unidled, its Promotion written, SIGUSR1 sent. False: no such member alive here (gone already)."""
    member = members.get(f"{msg.slot}.{msg.attempt}")
    if member is None or member.proc.poll() is not None:
        return False
    rank = rank_of(msg.slot)
    del members[f"{msg.slot}.{msg.attempt}"]
    member.slot = worker_slot(rank)
    members[f"{member.slot}.{msg.attempt}"] = member
    member.unidle()  # woken at normal CPU priority
    promotion = Promotion(msg.attempt, list(msg.skip_steps), msg.rollback_before, msg.launch_start_step)
    atomic_write(promotion_file(runtime_dir, msg.attempt, rank), encode(promotion)[0], durable=False)
    member.send_signal(signal.SIGUSR1)
    return True


__all__ = ["promote"]
