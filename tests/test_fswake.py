"""``procsv.common.fswake.wakeups``: woken by changes, never by reading what is watched.

Real inotify (the ``watchdog`` package's observer), real files. Before the fix the watchdog
package's "opened" and "closed_no_write" events woke a waiter each time it read the file it waits
for: ``procsv status --watch`` and ``procsv logs -f`` re-read at once, forever, and each used more
than a whole core beside the training they watched.
"""

from __future__ import annotations

import os
import threading

import pytest

from procsv.common.fswake import wakeups

QUIET = 0.5  # seconds without an event that count as "no event is coming"


def settle(woken: threading.Event, limit: float = 10.0) -> None:
    """Wait until no event has come for ``QUIET`` s (late events of earlier writes are drained)."""
    waited = 0.0
    while woken.wait(QUIET) and waited < limit:
        woken.clear()
        waited += QUIET
    woken.clear()


def replace(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def live(woken: threading.Event, folder: str, path: str) -> None:
    """Make sure the observer watches already: a change must wake it (then drain its events)."""
    replace(path, "first")
    assert woken.wait(10), "the observer saw no change"
    settle(woken)


def test_reading_the_watched_file_does_not_wake_its_waiter_and_a_change_does(tmp_path):
    folder, path = str(tmp_path), str(tmp_path / "status.json")
    replace(path, "0")
    with wakeups(folder, only=path) as woken:
        live(woken, folder, path)
        for _ in range(20):  # what `procsv status --watch` does at each wakeup
            with open(path) as fh:
                fh.read()
        assert not woken.wait(QUIET), "reading status.json woke the waiter that reads it"
        replace(path, "1")
        assert woken.wait(10), "an atomic replace of the watched file did not wake it"


@pytest.mark.slow
def test_listing_and_reading_a_watched_folder_does_not_wake_its_waiter_and_a_new_file_does(tmp_path):
    folder = str(tmp_path)
    replace(os.path.join(folder, "a.log"), "x")
    with wakeups(folder) as woken:
        live(woken, folder, os.path.join(folder, "a.log"))
        for _ in range(20):  # what `procsv logs -f` and a worker waiting for a checkpoint do
            os.listdir(folder)
            with open(os.path.join(folder, "a.log")) as fh:
                fh.read()
        assert not woken.wait(QUIET), "listing or reading the watched folder woke its waiter"
        with open(os.path.join(folder, "a.log"), "a") as fh:
            fh.write("more\n")
            fh.flush()
        assert woken.wait(10), "an append to a file in the watched folder did not wake it"
        settle(woken)
        os.mkdir(os.path.join(folder, "checkpoints"))
        assert woken.wait(10), "a new folder in the watched folder did not wake it"
