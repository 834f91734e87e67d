"""``logs/lifecycle.jsonl``: the run's history, one JSON object per line, in one schema.

Runs in the watchdog, the only writer of the file. Every record has ``time`` (wall clock, seconds
since the epoch) and ``event`` (an :class:`Event`), plus exactly the fields :data:`SCHEMA` lists
for that event; :meth:`EventLog.write` refuses anything else, so the schema below is the whole
truth. ``code``/``signal``: an exit status is either ``{"code": n}`` or ``{"signal": "SIGKILL"}``.

=====================  ==========================================================================
event                  fields
=====================  ==========================================================================
launch                 target, args, pid (the watchdog's), launch (its number per logdir, from 1)
                       (its time: when the watchdog process started; it is written once the logdir is locked)
spawned                role, attempt, pid, via (``fresh``, ``zygote``, ``standby``, or ``node<R>``: another host's agent)
zygote_ready           pid, import_secs
zygote_gone            pid
initialized            pid, step, path (null), secs, skipped (corrupt checkpoints passed over), prepared_at, warm_secs, source (null)
restored               pid, step, path, secs, skipped, prepared_at, warm_secs, source (memory: a group's in-memory snapshot; disk)
                       (prepared_at: the wall time the trainer began preparing its session, its program's
                       start-up done; warm_secs: its Supervisor.warm_up before the restore; secs: the restore)
worker_ready           role, attempt, pid, step, path, secs, prepared_at, warm_secs, source
                       (a group's worker, on any host, restored what its chief pinned, or initialized: path and
                       source null; relayed by its host's agent as its other reports are; the fields as restored's)
first_step             pid, step, secs_since_spawn
checkpoint_committed   step, path, reason, secs
checkpoint_failed      step, error
checkpoint_stalled     pid (of the checkpoint service replaced), reason
summary_stalled        pid (of the summary service replaced), reason
hang_detected          pid, attempt, step, reason, where, culprit, stacks, stacks_secs (the stacks taken before the SIGTERM)
                       where: its main thread's innermost frame; culprit: the group member they blame; stacks: their
                       file; stacks_secs: from the judgement to this signal, the time they took
chaos_kill             role, pid, signal
preempted              signal (the launch received it: an orderly stop begins)
death_noticed          role, attempt, pid, noticed (wall time of the death notice)
exited                 role, attempt, pid, noticed, code | signal
trained                role, attempt, pid, step, step_at, busy_secs, busy_from, ready_at, restored_step, restore_secs, first_at, first_step
                       (role: trainer, or a group's worker1 ...; step: its last completed; step_at: then, null
                       before its first step; busy_secs: its loop blocked by snapshots; busy_from: blocked from
                       then to its end, or null; ready_at/restored_step/restore_secs: its state restored, null
                       before; first_at/first_step: its first completed step, null before; a worker has no
                       restored/first_step records of its own, its worker_ready at its restore): written just
                       before its ``exited``
restarting             attempt (the next one), delay, error, rollback_step
                       (rollback_step: a trainer group's rollback, the step its members skip: a rollback, not
                       counted as a restart; else null)
restarted              attempt (the one being started)
breaker                attempt, role, pid, error, judged
                       (a trainer group's attempt, judged by a member's collective failure, judged ``judged``,
                       whose member ``role`` (pid) was found cut off after: killed by a signal procsv did not
                       send, or its host lost; ``error``: how, the attempt's true cause, which ``procsv report``
                       shows in place of its ``restarting`` record's)
gave_up                reason, error
task_gave_up           role (a --ps worker), attempt, reason, error (given up on; the run trains on)
finished               state, exit_code, step
orphans_killed         pids (processes of the run whose parent died, adopted and killed)
logdir_lost            path, reason (the logdir was deleted, moved or replaced: the run stops)
standby_ready          pid, attempt, secs (a hot standby waits, its program built, since spawn)
standby_decided        mode, reason (``--standby auto``: which mode the launch chose, and why)
suspended              secs, total
                       (the launch's process was stopped ``secs`` seconds, SIGSTOP then SIGCONT: Slurm's ``scontrol
                       suspend``/``resume``, job control; its timers leave that time out, ``total`` s so far)
node_joined            node, host, pid, link
                       (``--nnodes``: another host's agent connected, or came back; link: its connection that said
                       the hello, ``NodeHello.link``)
node_lost              node, host, silent_secs, reason (its agent went silent: its trainers count as dead)
node_refused           node, host, pid, key, reason (an agent's claim of a node rank another agent's key holds)
membership             attempt, nodes, hosts, world, left, joined, reason
                       (``--min-nodes``: the trainer group's attempt ``attempt`` starts on the hosts ``nodes``
                       (node 0 first, ranks in that order), ``world`` trainers; ``left``/``joined``: the hosts
                       out of, or back in, the group since the one before; the first group of a launch when
                       it starts on fewer than ``--nnodes`` hosts)
nonfinite_detected     pid, step (the first poisoned one), epoch, batch (its input position, Keras), what, repeats, peer
                       (what: a watched loss or a snapshot's state was found NaN or infinite; batch/epoch: null
                       outside Keras; repeats: the detections this record stands for, coalesced: a trainer's
                       first, then at most one a minute, and its last; peer: the pid of the member of its
                       trainer group that reported the same step first, a finding of the group counted once
                       (repeats 0), else null)
rolled_back            pid, step, epoch, batch, restored_step, source (``memory`` | ``disk``), path, skip, secs, group
                       (step: the poisoned one; epoch, batch: its input position, Keras, else null; skip
                       true: the step is skipped; false: it is retried once; secs: the restore's; group true:
                       a trainer group's rollback in place, every member, said by its chief)
step_skipped           pid, step (the global step it would have completed), epoch, batch, skipped (the run's so far)
spike_detected         pid, step, onset, loss, threshold, median, action, epoch, batch
                       (a finite loss far above its recent distribution, procsv/trainer/nonfinite/spike.py: step,
                       the first above the threshold; onset, the first step of the rise to it; median, of the
                       losses before it; action: what --on-spike does, rollback | stop | warn)
spike_replayed         pid, step, onset, reproduced, loss, replay_loss, host, differs_at
                       (--on-spike rollback replayed the spike from a snapshot before its onset: reproduced,
                       bit for bit, its steps are skipped; else a transient fault of the machine ``host``,
                       nothing is skipped; loss: the first loss of step, replay_loss: the replay's, or null;
                       differs_at: the first replayed step before the onset whose loss differs from the first
                       run's, or null: the program's input does not come back with the restored step, no
                       verdict, no fault of the host, the replayed state kept, training on)
host_suspect           host, faults, limit, step
                       (the host's transient faults in this launch reached --suspect-after ``limit``: it is
                       reported as suspect, once; step: the spike of its last fault; nothing is excluded or stopped)
group_copy_refused     rank, attempt, step, size, limit (node 0's checkpoint service refused a peer copy beyond its limit)
audit                  verdict, start, end, host, differ, auditors, reason
                       (--audit, issue 71: the verdict on the committed interval start-end: match | trainer (two
                       replays agree, not with the trainer: the trainer on ``host`` computed wrongly, it restores
                       step start) | auditor (the replays disagree: the auditors' ``host``) | nondeterministic (the
                       audit switches off, ``reason``) | unaudited (no replay could be made, or its auditors died
                       before their answer RETRIES + 1 times, ``reason``) | undecided (the next interval decides) |
                       trial (a group rolled back to step start once: the next interval tells a member's
                       fault from a program that does not replay; no host named);
                       differ: the tensors the judged interval's first replay found differing; auditors: the
                       attempts of the auditors whose replays (or deaths) it rests on, the judged interval's)
audit_quarantine       after, attempt, steps, reason
                       (--audit: the checkpoints of a timeline an audit rolled back, committed after step ``after``
                       by trainer ``attempt`` or an earlier one, told to the checkpoint service to quarantine)
=====================  ==========================================================================
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Optional


class Event(str, enum.Enum):
    """The lifecycle events, by the names they have in ``lifecycle.jsonl``."""

    LAUNCH = "launch"
    SPAWNED = "spawned"
    ZYGOTE_READY = "zygote_ready"
    ZYGOTE_GONE = "zygote_gone"
    INITIALIZED = "initialized"
    RESTORED = "restored"
    WORKER_READY = "worker_ready"
    FIRST_STEP = "first_step"
    CHECKPOINT_COMMITTED = "checkpoint_committed"
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_STALLED = "checkpoint_stalled"
    SUMMARY_STALLED = "summary_stalled"
    HANG_DETECTED = "hang_detected"
    CHAOS_KILL = "chaos_kill"
    PREEMPTED = "preempted"
    DEATH_NOTICED = "death_noticed"
    EXITED = "exited"
    TRAINED = "trained"
    RESTARTING = "restarting"
    RESTARTED = "restarted"
    BREAKER = "breaker"
    GAVE_UP = "gave_up"
    TASK_GAVE_UP = "task_gave_up"
    FINISHED = "finished"
    ORPHANS_KILLED = "orphans_killed"
    LOGDIR_LOST = "logdir_lost"
    STANDBY_READY = "standby_ready"
    STANDBY_DECIDED = "standby_decided"
    SUSPENDED = "suspended"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"
    NODE_REFUSED = "node_refused"
    MEMBERSHIP = "membership"
    NONFINITE_DETECTED = "nonfinite_detected"
    ROLLED_BACK = "rolled_back"
    STEP_SKIPPED = "step_skipped"
    SPIKE_DETECTED = "spike_detected"
    SPIKE_REPLAYED = "spike_replayed"
    HOST_SUSPECT = "host_suspect"
    GROUP_COPY_REFUSED = "group_copy_refused"
    AUDIT = "audit"
    AUDIT_QUARANTINE = "audit_quarantine"


_RESTORE = frozenset({"pid", "step", "path", "secs", "skipped", "prepared_at", "warm_secs", "source"})

SCHEMA: dict[Event, frozenset[str]] = {
    Event.LAUNCH: frozenset({"target", "args", "pid", "launch"}),
    Event.SPAWNED: frozenset({"role", "attempt", "pid", "via"}),
    Event.ZYGOTE_READY: frozenset({"pid", "import_secs"}),
    Event.ZYGOTE_GONE: frozenset({"pid"}),
    Event.INITIALIZED: _RESTORE,
    Event.RESTORED: _RESTORE,
    Event.WORKER_READY: frozenset({"role", "attempt", "pid", "step", "path", "secs", "prepared_at", "warm_secs", "source"}),
    Event.FIRST_STEP: frozenset({"pid", "step", "secs_since_spawn"}),
    Event.CHECKPOINT_COMMITTED: frozenset({"step", "path", "reason", "secs"}),
    Event.CHECKPOINT_FAILED: frozenset({"step", "error"}),
    Event.CHECKPOINT_STALLED: frozenset({"pid", "reason"}),
    Event.SUMMARY_STALLED: frozenset({"pid", "reason"}),
    Event.HANG_DETECTED: frozenset({"pid", "attempt", "step", "reason", "where", "culprit", "stacks", "stacks_secs"}),
    Event.CHAOS_KILL: frozenset({"role", "pid", "signal"}),
    Event.PREEMPTED: frozenset({"signal"}),
    Event.DEATH_NOTICED: frozenset({"role", "attempt", "pid", "noticed"}),
    Event.EXITED: frozenset({"role", "attempt", "pid", "noticed", "code|signal"}),
    Event.TRAINED: frozenset({"role", "attempt", "pid", "step", "step_at", "busy_secs", "busy_from", "ready_at",
                              "restored_step", "restore_secs", "first_at", "first_step"}),
    Event.RESTARTING: frozenset({"attempt", "delay", "error", "rollback_step"}),
    Event.RESTARTED: frozenset({"attempt"}),
    Event.BREAKER: frozenset({"attempt", "role", "pid", "error", "judged"}),
    Event.GAVE_UP: frozenset({"reason", "error"}),
    Event.TASK_GAVE_UP: frozenset({"role", "attempt", "reason", "error"}),
    Event.FINISHED: frozenset({"state", "exit_code", "step"}),
    Event.ORPHANS_KILLED: frozenset({"pids"}),
    Event.LOGDIR_LOST: frozenset({"path", "reason"}),
    Event.STANDBY_READY: frozenset({"pid", "attempt", "secs"}),
    Event.STANDBY_DECIDED: frozenset({"mode", "reason"}),
    Event.SUSPENDED: frozenset({"secs", "total"}),
    Event.NODE_JOINED: frozenset({"node", "host", "pid", "link"}),
    Event.NODE_LOST: frozenset({"node", "host", "silent_secs", "reason"}),
    Event.NODE_REFUSED: frozenset({"node", "host", "pid", "key", "reason"}),
    Event.MEMBERSHIP: frozenset({"attempt", "nodes", "hosts", "world", "left", "joined", "reason"}),
    Event.NONFINITE_DETECTED: frozenset({"pid", "step", "epoch", "batch", "what", "repeats", "peer"}),
    Event.ROLLED_BACK: frozenset({"pid", "step", "restored_step", "source", "path", "skip", "secs", "epoch",
                                  "batch", "group"}),
    Event.STEP_SKIPPED: frozenset({"pid", "step", "epoch", "batch", "skipped"}),
    Event.SPIKE_DETECTED: frozenset({"pid", "step", "onset", "loss", "threshold", "median", "action", "epoch",
                                     "batch"}),
    Event.SPIKE_REPLAYED: frozenset({"pid", "step", "onset", "reproduced", "loss", "replay_loss", "host",
                                     "differs_at"}),
    Event.HOST_SUSPECT: frozenset({"host", "faults", "limit", "step"}),
    Event.AUDIT: frozenset({"verdict", "start", "end", "host", "differ", "auditors", "reason"}),
    Event.AUDIT_QUARANTINE: frozenset({"after", "attempt", "steps", "reason"}),
    Event.GROUP_COPY_REFUSED: frozenset({"rank", "attempt", "step", "size", "limit"}),
}


class SchemaError(ValueError):
    """A lifecycle record whose fields are not the ones :data:`SCHEMA` lists for its event."""


def check(event: Event, fields: dict[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``fields`` are exactly the schema's for ``event``."""
    want = set()
    for name in SCHEMA[event]:
        if "|" in name:
            options = set(name.split("|"))
            found = options & set(fields)
            if len(found) != 1:
                raise SchemaError(f"{event.value}: exactly one of {sorted(options)} is required")
            want |= found
        else:
            want.add(name)
    if set(fields) != want:
        raise SchemaError(f"{event.value}: fields {sorted(fields)} are not {sorted(want)}")


@dataclass(frozen=True)
class Report:
    """Something to record: a lifecycle event (with its fields) and/or a line for the terminal."""

    event: Optional[Event] = None
    fields: dict[str, Any] = field(default_factory=dict)
    say: str = ""
    err: bool = False  # the line goes to stderr
    at: Optional[float] = None  # when it happened (wall time), if not now


class EventLog:
    """Appends checked records to ``lifecycle.jsonl`` (line-buffered: a crash loses at most a line)."""

    def __init__(self, path: str, complain: Callable[[str], None] = lambda text: None) -> None:
        self.path = path
        self._complain = complain
        self.lost = 0  # records that could not be written (ENOSPC, EIO): reported once, then counted
        self._fh: Optional[IO[str]] = open(path, "a", buffering=1)

    def write(self, event: Event, at: float, **fields: Any) -> None:
        """Append one record (``at``: when it happened, wall time, as the loop recorded it); a failing
        write is counted and reported once, never raised."""
        check(event, fields)
        if self._fh is None:
            return
        try:
            self._fh.write(json.dumps({"time": at, "event": event.value, **fields}) + "\n")
        except OSError as exc:
            self.lost += 1
            if self.lost == 1:
                self._complain(f"procsv: cannot append to {self.path} ({exc.strerror or exc}); "
                               "lifecycle events are lost until it can (the run goes on)")

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None


def read_events(path: str) -> list[dict[str, Any]]:
    """Every whole record of ``lifecycle.jsonl`` (a torn last line is skipped); none if there is no file.
    Its readers: ``procsv report`` (:mod:`procsv.report`) and the watchdog's final ``logs/report.json``
    (its ``run``: every launch of the logdir), in the logdir writer thread."""
    out = []
    try:
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("time"), (int, float)):
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


SKIPPED_MARK = b'"step_skipped"'


def skipped_steps(path: str) -> tuple[int, ...]:
    """The steps of every ``step_skipped`` record in the lifecycle file ``path``, sorted, each once (none:
    no file; a torn or foreign line is passed over). Read by the watchdog once, at a launch's start, before
    its own records: an earlier launch's skipped steps stay skipped in this one (issue 52), and the
    watchdog tells its trainers (``ChildConfig.resume``). Only lines naming ``step_skipped`` are parsed:
    the file spans every launch of the logdir and may be long."""
    steps: set[int] = set()
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if SKIPPED_MARK not in line or not line.endswith(b"\n"):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("event") == "step_skipped" and isinstance(rec.get("step"), int):
                    steps.add(int(rec["step"]))
    except OSError:
        return ()
    return tuple(sorted(steps))
