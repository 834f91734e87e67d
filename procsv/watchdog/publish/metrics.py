"""``procsv launch --metrics-port PORT``: Prometheus text metrics of the run, served by the watchdog.

Runs in the watchdog process, in threads of its own: a ``wsgiref`` HTTP server of ``prometheus_client``'s
WSGI app (a daemon thread, plus one short-lived thread per scrape). Nothing here runs in the watchdog's loop and
nothing here can make it wait: the loop publishes an immutable
:class:`~procsv.watchdog.publish.runmetrics.RunSnapshot` (one reference replaced, at most every 0.5 s),
and a scrape builds the metric families from the latest one (:func:`families`, pure) plus the
summary service's ``summary_stats.json``, read in the scrape's thread. So the freshness of a
scrape is at most half a second; the checkpoint age is computed at the scrape.

Why a collector over a snapshot, not gauges set from the loop: the loop pays one small object per
half second whether or not anyone scrapes, there is no lock the loop could wait on, and a scrape
sees all the numbers of one moment (gauges set one by one can be read half-updated).

The registry is a private :class:`~prometheus_client.CollectorRegistry` (never the library's
global one): the run's collector and ``prometheus_client``'s process collector for the watchdog
itself (``procsv_watchdog_process_*``: CPU, RSS, fds; it reads ``/proc/self`` at the scrape).
The server binds before any process of the run starts: an address in use (or not of this
machine) is a :class:`~procsv.common.errors.UsageError`, one line, exit 2.

The same endpoint answers the probes ``/healthz`` and ``/readyz``
(:mod:`procsv.watchdog.publish.probes`, from the loop's :class:`~procsv.watchdog.publish.probes.LoopPulse`);
every other path is the metrics, as ``prometheus_client`` serves them.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import (CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric,
                                            StateSetMetricFamily)

from procsv.common.errors import UsageError
from procsv.common.layout import read_json
from procsv.watchdog.publish.probes import LoopPulse
from procsv.watchdog.publish.runmetrics import RunSnapshot

RUN_STATES = ("running", "succeeded", "failed", "stopped")


def families(snap: Optional[RunSnapshot], now: float, summaries_dropped: Optional[int],
             info: dict[str, str]) -> list[Metric]:
    """The metric families of ``snap`` at wall time ``now`` (None: the loop has published nothing
    yet: only ``procsv_up`` 0 and the info)."""
    out: list[Metric] = [InfoMetricFamily("procsv_run", "The launch: its target and logdir.", value=info)]
    up = GaugeMetricFamily("procsv_up", "1 while the run is live (its outcome not decided yet), else 0.")
    up.add_metric([], 1.0 if snap is not None and snap.live else 0.0)
    out.append(up)
    if snap is None:
        return out
    state = StateSetMetricFamily("procsv_run_state", "The run's state.",
                                 value={s: s == snap.run for s in RUN_STATES})
    out.append(state)
    out.append(GaugeMetricFamily("procsv_start_time_seconds", "When the launch started (Unix time).",
                                 value=snap.started_at))
    out.append(GaugeMetricFamily("procsv_step", "The trainer's global step (the last completed step).",
                                 value=snap.step))
    if snap.steps_per_sec is not None:
        out.append(GaugeMetricFamily("procsv_steps_per_second",
                                     "Steps per second of the current trainer attempt over the last 10 s.",
                                     value=snap.steps_per_sec))
    out.append(GaugeMetricFamily("procsv_trainer_attempt", "The trainer's current attempt (1, 2, ...).",
                                 value=snap.attempt))
    restarts = CounterMetricFamily("procsv_restarts", "Trainer restarts, by what ended the attempt before.",
                                   labels=["cause"])
    for cause, n in snap.restarts:
        restarts.add_metric([cause], n)
    out.append(restarts)
    services = CounterMetricFamily("procsv_service_restarts", "Restarts of the checkpoint and summary services.",
                                   labels=["role"])
    for role, n in snap.service_restarts:
        services.add_metric([role], n)
    out.append(services)
    if snap.task_restarts:  # --ps: each task restarts alone
        tasks = CounterMetricFamily("procsv_task_restarts", "Restarts of each task of a --ps launch (the chief, "
                                    "workerN, psN), by task and role.", labels=["task", "role"])
        for task, role, n in snap.task_restarts:
            tasks.add_metric([task, role], n)
        out.append(tasks)
    out.append(CounterMetricFamily("procsv_steps_redone", "Steps trained again after restarts (done after the "
                                   "checkpoint the next attempt restored).", value=snap.steps_redone))
    if snap.goodput is not None:
        out.append(GaugeMetricFamily("procsv_goodput", "Share of the launch's wall time spent on steps that were "
                                     "kept (0..1).", value=snap.goodput))
    if snap.time_by_kind:
        spent = GaugeMetricFamily("procsv_time_seconds", "Where this launch's wall time went, by kind (productive, "
                                  "startup, restoring, checkpoint, redone, restart, stopped, unaccounted): they "
                                  "sum to the time since the launch started.", labels=["kind"])
        for kind, secs in snap.time_by_kind:
            spent.add_metric([kind], secs)
        out.append(spent)
    out.append(CounterMetricFamily("procsv_checkpoints", "Checkpoints committed during this launch.",
                                   value=snap.checkpoints))
    out.append(CounterMetricFamily("procsv_checkpoint_failures", "Checkpoints that failed to commit during this "
                                   "launch.", value=snap.checkpoint_failures))
    out.append(CounterMetricFamily("procsv_logdir_errors", "Looks at the logdir that failed without saying it "
                                   "is gone (EIO, ESTALE: a filesystem's blip) during this launch.",
                                   value=snap.logdir_errors))
    out.append(CounterMetricFamily("procsv_steps_skipped", "Steps skipped because their loss was NaN or infinite "
                                   "(--on-nonfinite rollback: a single trainer's twice, a trainer group's once): no "
                                   "variable changed, the global step moved on.",
                                   value=snap.training.steps_skipped))
    out.append(CounterMetricFamily("procsv_rollbacks", "Restores of a finite state after a NaN or infinite loss "
                                   "(--on-nonfinite rollback): a single trainer's in place, a trainer group's by "
                                   "restarting the group (not counted in procsv_restarts).",
                                   value=snap.training.rollbacks))
    out += spike_families(snap)
    if snap.group_hosts is not None:  # --nnodes
        out.append(GaugeMetricFamily("procsv_group_hosts", "The hosts the trainer group runs on now (--nnodes; fewer "
                                     "while an elastic group, --min-nodes, trains on without some).",
                                     value=snap.group_hosts))
        out.append(GaugeMetricFamily("procsv_live_hosts", "The hosts whose agent is connected now, node 0 included.",
                                     value=snap.live_hosts or 0))
        out.append(CounterMetricFamily("procsv_membership_changes", "Trainer groups started on other hosts than the "
                                       "group before them (--min-nodes: a host left, or was taken back).",
                                       value=snap.membership_changes))
    if snap.last_checkpoint_step is not None:
        out.append(GaugeMetricFamily("procsv_last_checkpoint_step", "The step of the last committed checkpoint "
                                     "(before the first commit of this launch: the newest on disk).",
                                     value=snap.last_checkpoint_step))
    if snap.last_checkpoint_at is not None:
        out.append(GaugeMetricFamily("procsv_last_checkpoint_age_seconds", "Seconds since the newest committed "
                                     "checkpoint of the run committed (an earlier launch's until this one commits).",
                                     value=max(0.0, now - snap.last_checkpoint_at)))
        out.append(GaugeMetricFamily("procsv_last_checkpoint_timestamp_seconds", "When the newest committed "
                                     "checkpoint of the run committed (Unix time).", value=snap.last_checkpoint_at))
    if snap.last_checkpoint_secs is not None:
        out.append(GaugeMetricFamily("procsv_last_checkpoint_commit_seconds", "How long the checkpoint service took "
                                     "to persist the last checkpoint.", value=snap.last_checkpoint_secs))
    if summaries_dropped is not None:
        out.append(GaugeMetricFamily("procsv_summaries_dropped", "Summaries dropped (trainer buffer full, or "
                                     "malformed), as the summary service counts them.", value=summaries_dropped))
    return out


def spike_families(snap: RunSnapshot) -> list[Metric]:
    """Loss spikes (issue 68): by ``--on-spike`` action; transient faults (spikes not again when
    replayed) by host; the hosts reported suspect (``--suspect-after``)."""
    spikes = CounterMetricFamily("procsv_loss_spikes", "Loss spikes found (a finite loss far above its recent "
                                 "distribution), by what --on-spike did: rollback, stop or warn.", labels=["action"])
    for action, n in snap.training.spikes:
        spikes.add_metric([action], n)
    faults = CounterMetricFamily("procsv_transient_faults", "Loss spikes that did not come again when replayed "
                                 "(--on-spike rollback): transient faults of the machine, by host.", labels=["host"])
    for host, n in snap.training.transient:
        faults.add_metric([host], n)
    suspect = GaugeMetricFamily("procsv_host_suspect", "1 for each host reported as suspect: its transient faults "
                                "in this launch reached --suspect-after (nothing is excluded or stopped for it).",
                                labels=["host"])
    for host in snap.training.suspects:
        suspect.add_metric([host], 1.0)
    wrong = CounterMetricFamily("procsv_audit_miscomputed", "Committed intervals two audit replays agree the "
                                "trainer computed wrongly (--audit: silent data corruption), by the trainer's host.",
                                labels=["host"])
    for host, n in snap.training.miscomputed:
        wrong.add_metric([host], n)
    audited = GaugeMetricFamily("procsv_audited_fraction", "The fraction of the committed steps an audit replayed "
                                "bit-equal (--audit; 0 when off).")
    audited.add_metric([], snap.training.audited)
    return [spikes, faults, suspect, wrong, audited]


def summaries_dropped(stats_path: str) -> Optional[int]:
    """``dropped`` from the summary service's ``summary_stats.json`` (None: not written yet, or torn)."""
    stats = read_json(stats_path)
    if not isinstance(stats, dict):
        return None
    value = stats.get("dropped")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RunCollector:
    """A ``prometheus_client`` collector: the families of the latest published snapshot, at scrape time."""

    def __init__(self, latest: Callable[[], Optional[RunSnapshot]], stats_path: str, info: dict[str, str],
                 wall: Callable[[], float] = time.time) -> None:
        self._latest = latest
        self._stats_path = stats_path
        self._info = info
        self._wall = wall

    def collect(self) -> Iterator[Metric]:
        yield from families(self._latest(), self._wall(), summaries_dropped(self._stats_path), self._info)


class _Quiet(WSGIRequestHandler):
    """No line per request on the watchdog's stderr (a probe comes every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


def probe_app(metrics: Optional[Callable[..., Iterable[bytes]]], pulse: LoopPulse) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``/healthz`` and ``/readyz`` from ``pulse``, every other path ``metrics`` (None: 404,
    a node agent's endpoint, which serves only the probes)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        got = pulse.answer(environ.get("PATH_INFO", ""))
        if got is None and metrics is not None:
            return metrics(environ, start_response)
        status, text = (got.status, got.text) if got is not None else \
            ("404 Not Found", "this node serves only /healthz and /readyz: the metrics are node 0's\n")
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
        return [text.encode()]

    return app


class MetricsServer:
    """The HTTP endpoint (``/metrics`` and any path; ``/healthz``, ``/readyz``), bound at construction and
    served by a daemon thread."""

    def __init__(self, host: str, port: int, collector: Optional[RunCollector], pulse: LoopPulse) -> None:
        """``collector`` None: the probes only (a node agent's ``--metrics-port``)."""
        registry = CollectorRegistry(auto_describe=False)
        if collector is not None:
            registry.register(collector)
            ProcessCollector(namespace="procsv_watchdog", registry=registry)
        self.address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        try:
            family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                        flags=socket.AI_PASSIVE)[0]

            class Server(ThreadingWSGIServer):
                address_family = family

            app = probe_app(make_wsgi_app(registry) if collector is not None else None, pulse)
            self._server = make_server(str(where[0]), port, app, Server,
                                       handler_class=_Quiet)
        except OSError as exc:  # EADDRINUSE, EADDRNOTAVAIL, EACCES; a name that does not resolve (gaierror)
            raise UsageError(f"cannot serve metrics on {self.address} (--metrics-host/--metrics-port): "
                             f"{exc.strerror or exc}; nothing was started") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="procsv-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def close(self) -> None:
        """Stop serving and close the listening socket (waits at most the server's 0.5 s poll)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
