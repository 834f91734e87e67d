"""A MonitoredSession without services, for fast tests of hook logic: a fake Supervisor whose steps
only advance a real global step variable, with a fake clock and recorded summaries."""

from __future__ import annotations

from typing import Any


class FakeManaged:
    def __init__(self, sv: "FakeSupervisor") -> None:
        self.sv = sv

    def run(self, fn, *args, **kwargs):
        if self.sv.coord.should_stop():
            from procsv import TrainingStopped

            raise TrainingStopped("stopped")
        out = fn(*args, **kwargs)
        self.sv.global_step.assign_add(1)
        self.sv.now[0] += self.sv.secs_per_step
        return out


class FakeRollback:
    """The non-finite rollback's port of a Supervisor whose policy is not ``rollback``: hooks run."""

    replaces_nan_hooks = False

    def settle_at_end(self, replay: Any) -> None:
        """Nothing rolled back, nothing to finish at the loop's end."""


class FakeFrontEnd:
    """What the sessions and hooks ask of a procsv.Supervisor's ``front_end``: its clock, its session,
    its stop (nothing is saved: no listening to saves; no rollback)."""

    def __init__(self, sv: "FakeSupervisor") -> None:
        self.clock = lambda: sv.now[0]
        self.session = FakeManaged(sv)
        self.stop_quietly = sv.stop
        self.rollback = FakeRollback()

    def listen_to_saves(self, before: Any, after: Any) -> None:
        return None


class FakeSupervisor:
    def __init__(self, global_step: Any, secs_per_step: float = 1.0) -> None:
        from procsv.train import Coordinator

        self.global_step = global_step
        self.now = [1000.0]
        self.secs_per_step = secs_per_step
        self.front_end = FakeFrontEnd(self)
        self.coord = Coordinator(clock=self.front_end.clock)
        self.logdir = "/nonexistent/fake-logdir"
        self.scalars: list[tuple[str, float, int]] = []
        self.stopped = False

    def should_stop(self) -> bool:
        return self.coord.should_stop()

    def request_stop(self, ex=None) -> None:
        self.coord.request_stop(ex)

    def stop(self) -> None:
        self.coord.request_stop()
        self.stopped = True

    def log_scalar(self, tag, value, step=None) -> None:
        self.scalars.append((tag, float(value), int(step)))

    def log_histogram(self, tag, values, step=None, buckets=None) -> None:
        self.scalars.append((tag, float("nan"), int(step)))

    def summary_computed(self, sess, summary, global_step=None) -> None:
        self.scalars.append(("proto", float("nan"), int(global_step)))


class FakeCreator:
    """Stands in for ChiefSessionCreator: same interface, a FakeSupervisor behind the raw session."""

    def __init__(self, secs_per_step: float = 1.0) -> None:
        from procsv.train import Scaffold, get_or_create_global_step

        self.scaffold = Scaffold()
        self.supervisor_options: dict[str, Any] = {}
        self._gs = get_or_create_global_step()
        self.supervisor = FakeSupervisor(self._gs, secs_per_step)

    def global_step(self):
        return self._gs

    def create_session(self):
        from procsv.trainer.monitored.scaffold import RawSession

        return RawSession(self.supervisor, self.supervisor.front_end.session)
