"""Several launches made at once beside one pair of CPU burners (one loaded window), for test modules
whose tests each ran one launch beside burners of its own: the burners (two cores' worth of load)
run for the longest of the launches, not for their sum, and each launch is loaded at least as much
as before (the burners, and the other launches beside it).

Each launch is a callable returning ``finish``'s (code, stdout, stderr); what it returned (or the
error it raised), and the pids of its run's processes left behind (SIGKILLed, as the ``logdir``
fixture does), are written to ``<folder>/<name>.json`` for the tests to read and assert on."""

from __future__ import annotations

import json
import os
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from conftest import cpu_burners_beside, kill_leftovers

Run = Callable[[], tuple[int, str, str]]


def launch_together_loaded(folder: str, runs: dict[str, tuple[str, Run]], at_once: int = 0) -> None:
    """Run every ``runs`` (name -> (its logdir, the callable that launches it and waits for its end))
    beside two CPU burners, all at once (or ``at_once`` at a time, in their order: the next starts when
    one ends); write each one's result to ``<folder>/<name>.json``."""
    def one(name: str, logdir: str, run: Run) -> dict[str, Any]:
        try:
            code, out, err = run()
            result: dict[str, Any] = {"code": code, "out": out, "err": err, "error": None}
        except BaseException:  # noqa: BLE001 (recorded: the test of this launch fails with it)
            result = {"code": None, "out": "", "err": "", "error": traceback.format_exc()}
        result["leftovers"] = kill_leftovers(logdir)
        return result

    with cpu_burners_beside(), ThreadPoolExecutor(at_once or len(runs)) as pool:
        futures = {name: pool.submit(one, name, logdir, run) for name, (logdir, run) in runs.items()}
        results = {name: future.result() for name, future in futures.items()}
    for name, result in results.items():
        with open(os.path.join(folder, f"{name}.json"), "w") as fh:
            json.dump(result, fh)


def loaded_result(folder: str, name: str) -> tuple[int, str, str]:
    """(code, stdout, stderr) of the launch ``name`` of :func:`launch_together_loaded` in ``folder``;
    fails the test if the launch raised or left processes of its run behind."""
    with open(os.path.join(folder, f"{name}.json")) as fh:
        result = json.load(fh)
    assert result["error"] is None, result["error"]
    assert not result["leftovers"], f"processes of the run were left behind: {result['leftovers']}"
    return result["code"], result["out"], result["err"]
