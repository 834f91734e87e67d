"""The ``procsv stacks`` command: the stacks of a live run's processes, read with py-spy (issue 69).

Runs in the user's shell (the ``procsv stacks`` process), on node 0's host. The members on this host are
read here, with the watchdog's own capture (:mod:`procsv.watchdog.stacks.capture`); those on other hosts
are asked of node 0's watchdog through its ``stacks.sock`` (the status file names it), whose agents read
them there. A member no one answered for is named missing, never left out silently.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

import zmq

from procsv.common.errors import UsageError
from procsv.ipc.codec import ProtocolError, decode
from procsv.ipc.stack_messages import StacksAsked, StacksTaken
from procsv.ipc.transport import ReceiveTimeout, make_socket, recv, send
from procsv.watchdog.stacks.capture import finish_reading, py_spy, render, start_reading, to_json


def show(status: dict[str, Any], logdir: str, every: bool, native: bool, as_json: bool) -> bool:
    """Print the stacks of the run's live processes (its trainers; ``every``: the services too), those on other
    hosts asked of node 0's watchdog; True where every one was read, False where one failed or is missing."""
    if py_spy() is None:
        raise UsageError("py-spy is not installed beside this Python: pip install py-spy")
    services = ("watchdog", "checkpoint", "summary")
    procs = [p for p in status.get("processes", []) if p.get("alive") and (every or p.get("role") not in services)]
    away = [p for p in status.get("processes", []) if p.get("alive") is None and p.get("role") not in services]
    if not procs and not away:
        raise UsageError(f"the run in {logdir!r} has no live trainer right now")
    asked = ask_other_hosts(str(status.get("stacks_endpoint") or ""), native) if away else None
    stacks = finish_reading(start_reading([(str(p["role"]), int(p["pid"])) for p in procs], native),
                            STACKS_SECS - 0.2)
    there, missing = asked() if asked is not None else ([], [
        f"{p.get('role')} runs on host {p.get('host', '?')}: its stacks are not read from here" for p in away])
    stacks += there
    if asked is not None:
        missing += unanswered(away, {s.role for s in there}, missing)
    if as_json:
        print(json.dumps({"processes": [to_json(s) for s in stacks], "missing": missing}, indent=1))
    else:
        print(render(stacks), end="")
        for line in missing:
            print(line)
    return not (any(s.error for s in stacks) or missing)


def unanswered(away: list[dict[str, Any]], read: set[str], missing: list[str]) -> list[str]:
    """A line for each member on another host that status.json lists and no agent answered for (its host
    found lost, a restart under way), unless ``missing`` names it already: never left out silently (before:
    an empty answer printed nothing and exited 0)."""
    return [f"{p.get('role')} on host {p.get('host', '?')}: no stacks came back for it (its host may be lost, or "
            "it is restarting)" for p in away
            if p.get("role") not in read and not any(str(p.get("role")) in line for line in missing)]


STACKS_SECS = 2.0  # procsv stacks answers within this (issue 69), the other hosts' members too


def ask_other_hosts(endpoint: str, native: bool) -> "Optional[Callable[[], tuple[list[Any], list[str]]]]":
    """Ask node 0's watchdog for the stacks of the members on other hosts (their agents read them), or
    None where the run names no endpoint for it (an older procsv); the answer is taken by the call returned."""
    if not endpoint:
        return None
    until = time.monotonic() + STACKS_SECS - 0.1
    zctx: "zmq.Context[Any]" = zmq.Context()
    sock = make_socket(zctx, zmq.DEALER)
    sock.connect(endpoint)
    send(sock, StacksAsked(1, [], native, STACKS_SECS - 0.4))

    def answer() -> tuple[list[Any], list[str]]:
        got: list[Any] = []
        of: Optional[int] = None
        try:
            while of is None or len(got) < of:
                try:
                    msg, _ = decode(recv(sock, max(1, int(1000 * (until - time.monotonic())))), frozenset({StacksTaken}))
                except ReceiveTimeout:
                    break
                except ProtocolError:
                    continue
                assert isinstance(msg, StacksTaken)
                of = msg.of
                if msg.stacks is not None:
                    got.append(msg.stacks)
        finally:
            sock.close(0)
            zctx.term()
        late = [] if of is not None and len(got) >= of else \
            [f"the watchdog did not answer for the other hosts' members within {STACKS_SECS:g} s"]
        return got, late

    return answer
