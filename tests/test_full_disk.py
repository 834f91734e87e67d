"""End to end: a filesystem that fills to 0 bytes free in the middle of a run.

Real processes (``procsv launch`` on the digits example) on a real 16 MiB tmpfs filled to its last
byte (root mounts it; the test is skipped where it cannot). Nothing procsv writes fits any more:
not a checkpoint, not an event record, not a log line, not ``status.json``. The services must stay
up through that (dropping and counting what they cannot write), the checkpoints keep failing, and
the run must stop in order with exit code 3, the newest good checkpoint intact.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import committed_steps, finish, launch, wait_for
from test_checkpoint_faults import _all_committed_verify, _fill, _latest_loads, small_fs  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_disk_filled_to_0_bytes_stops_the_run_in_order_with_exit_3_and_no_service_restart(small_fs):
    mnt = small_fs
    logdir = str(mnt / "run")
    proc = launch(logdir, "--steps", "100000", "--save-model-secs", "0.3", "--step-delay", "0.005")
    try:
        wait_for(lambda: len(committed_steps(logdir)) >= 2, 90, what="two committed checkpoints")
        _fill(str(mnt / "filler"), leave=0)
        assert _free_bytes(str(mnt)) == 0
    finally:
        code, out, err = finish(proc)  # the launch ends by itself
    said = out + err
    assert code == 3, said
    assert "3 checkpoints in a row failed to commit" in err and "No space left on device" in err, said
    # the services stayed up: neither died (the watchdog says so on the terminal; its event log
    # is on the full filesystem too)
    for role in ("checkpoint", "summary"):
        assert f"restarting the {role} service" not in said and f"the {role} service failed" not in said, said
        assert not re.search(rf"{role} attempt \d+ \(pid \d+\) exited", said), said
    # nor did the trainer: a line it prints on the full disk is dropped, not its death (ENOSPC)
    assert "restart 1)" not in said and "ENOSPC" not in said and "No space left on device: '<stdout>'" not in said, said
    os.unlink(str(mnt / "filler"))
    kept = committed_steps(logdir)[-1]
    assert _latest_loads(logdir) == kept  # the newest good checkpoint is intact and the latest
    _all_committed_verify(logdir)


def test_an_event_file_on_a_full_disk_refuses_whole_records_and_resumes_when_there_is_room(small_fs):
    """The summary service's event file on a real full tmpfs: a refused write raises and leaves no
    torn record (the kernel took part of it: it is cut off again), the file-version record that did
    not fit at creation comes first once there is room, and TensorBoard reads every record."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    from procsv.services.summary import records
    from procsv.services.summary.eventfile import EventFile

    mnt = small_fs
    logdir = str(mnt / "run")
    os.mkdir(logdir)
    _fill(str(mnt / "filler"), leave=0)
    assert _free_bytes(str(mnt)) == 0
    ev = EventFile(logdir, "test")  # made on the full disk: its first record does not fit
    assert os.path.getsize(ev.path) == 0
    big = records.frame(records.summary_event(1.0, 1, records.scalar_summary("a", 1.0))) * 5000
    with pytest.raises(OSError):
        ev.write(big)
    assert os.path.getsize(ev.path) == 0
    os.unlink(str(mnt / "filler"))
    _fill(str(mnt / "filler"), leave=64 << 10)  # room for some records, not for all of big
    with pytest.raises(OSError):
        ev.write(big * 4)
    assert os.path.getsize(ev.path) == 0  # what the kernel took was cut off again
    one = records.frame(records.summary_event(2.0, 2, records.scalar_summary("b", 2.0)))
    ev.write(one)
    ev.close()
    got = list(RawEventFileLoader(ev.path).Load())
    assert len(got) == 2 and got[1] == one[12:-4]  # the file-version record, then the one written
