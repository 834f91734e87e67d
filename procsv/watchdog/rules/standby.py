"""The hot standby's rules: whether one may run, when one is prepared, what a restart does with it.

Runs in the watchdog. Pure: called by :func:`procsv.watchdog.rules.decide.decide` with the observed
:class:`~procsv.watchdog.rules.state.RunView` and the time, and by the launcher with two numbers for the
memory rule; nothing here touches a process.

A hot standby is a second trainer process, forked from the pre-warmed zygote, that runs the
program up to the point of restoring (its module imported, data loaded, model and optimizer
built, the Supervisor created) and waits there for SIGUSR1 (:mod:`procsv.trainer.standby.wait`).
When the trainer dies, the restart promotes it instead of forking: it restores the newest
checkpoint (the in-memory snapshot the checkpoint service just persisted) and trains on. Rules:

- **Prepare** one once the current trainer has completed a step (so a program that never
  creates a Supervisor never gets one, and the standby never competes with a trainer's start),
  while the zygote is ready, no fork is pending, no stop is under way, and the memory rule allows.
  After a standby ends on its own (a crash, or killed from outside), the next waits
  :func:`backoff` seconds; after :data:`GIVE_UP_AFTER` such ends in a row there is none for the
  rest of the run (restarts fork from the zygote, as with ``--standby fork``).
- **Promote** it when a trainer restart is due and it is ready for that attempt; a standby that is
  not ready yet (several kills in a row) is killed and the restart forks from the zygote.
- **Memory** (``--standby auto``, the default): a standby holds at most what the trainer held
  before its first step, so it is started only if the memory available is at least twice the
  trainer's resident size plus 1 GiB (:func:`memory_allows`), measured once at the first
  trainer's first step.
"""

from __future__ import annotations

from procsv.watchdog.rules.state import RunView, ZygoteState, TRAINER

GIVE_UP_AFTER = 5  # standby ends in a row (not caused by the watchdog) after which none is prepared
HEADROOM = 1 << 30  # bytes of memory left over beyond twice the trainer's size
MODES = ("auto", "hot", "fork", "off")


def backoff(failures: int) -> float:
    """Seconds before the next standby after ``failures`` ends in a row (1, 2, 4, ... at most 30)."""
    return min(30.0, 2.0 ** max(0, failures - 1))


def memory_allows(trainer_rss: int, available: int) -> tuple[bool, str]:
    """Whether a standby fits beside a trainer of ``trainer_rss`` bytes, and a line saying why."""
    need = 2 * trainer_rss + HEADROOM
    ok = available >= need
    why = (f"the trainer uses {trainer_rss / 2**20:.0f} MiB and {available / 2**30:.1f} GiB are available "
           f"({'at least' if ok else 'less than'} twice the trainer's size plus 1 GiB)")
    return ok, why


def may_prepare(view: RunView, now: float) -> bool:
    """Rule 10: a standby should be prepared now."""
    if view.standby_ok is not True or view.stop_signal is not None or view.finishing:
        return False
    if view.zygote != ZygoteState.READY or view.forking or view.restart_at is not None:
        return False
    current = view.standby()
    if current is not None and not current.settled:
        return False
    trainer = view.children.get(TRAINER)
    if trainer is None or not trainer.live or trainer.first_step_at is None:
        return False
    return view.standby_failures < GIVE_UP_AFTER and now >= view.standby_after


def promotable(view: RunView) -> bool:
    """The standby is ready to become the next trainer attempt."""
    sb = view.standby()
    trainer = view.children.get(TRAINER)
    return (sb is not None and sb.live and sb.standby_ready_at is not None and trainer is not None
            and sb.attempt == trainer.attempt + 1)
