"""``housekeeping.clear_stale_temps``: what a launch removes of writes an earlier one's kill cut short.

Real files: an atomic write killed between its temp file and its rename leaves ``.tmp-XXXXXXXX``
beside status.json, a manifest, TF's state file or a log; the next launch removes exactly those,
nothing of the user's. One temp file is left by a real process SIGKILLed inside ``atomic_write``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from procsv.common.layout import Layout
from procsv.watchdog.housekeeping import clear_stale_temps


def test_the_temp_files_of_cut_short_writes_go_and_nothing_else(tmp_path):
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    # a real writer SIGKILLed between its temp file and its rename (its fsync never returns here)
    code = ("import os, sys\n"
            "from procsv.common import layout\n"
            "os.fsync = lambda fd: (print('written', flush=True), __import__('time').sleep(60))\n"
            f"layout.write_json({layout.status!r}, {{'state': 'running'}})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "written\n"
    finally:
        proc.send_signal(signal.SIGKILL)  # never left behind, whatever the assertion says
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    left = [n for n in os.listdir(layout.meta) if n.startswith(".tmp-")]
    assert len(left) == 1 and not os.path.exists(layout.status)
    planted = [os.path.join(layout.meta, left[0])]
    for folder, name in ((layout.logdir, ".tmp-ab12cd_3"), (layout.manifests, ".tmp-x9y8z7w6"),
                         (layout.logs, ".tmp-00000000")):
        planted.append(os.path.join(folder, name))
        with open(planted[-1], "w") as fh:
            fh.write("{")
    theirs = [os.path.join(layout.logdir, n) for n in (".tmp-notes.txt", "tmp-abcdefgh", ".tmp-ABCDEFGH")]
    for path in theirs:
        with open(path, "w") as fh:
            fh.write("mine")
    os.mkdir(os.path.join(layout.logdir, ".tmp-qwertyui"))  # a folder, not a write of procsv's
    assert sorted(clear_stale_temps(layout)) == sorted(planted)
    assert all(os.path.exists(p) for p in theirs) and os.path.isdir(os.path.join(layout.logdir, ".tmp-qwertyui"))
    assert not any(os.path.exists(p) for p in planted)
    assert clear_stale_temps(layout) == []
