"""A teammate without read access to a run's files gets one line, not a traceback.

``.procsv/`` at 0700 (a umask of 077, a ``chmod``) is the owner's alone: another user's ``procsv
status``, ``logs`` or ``report`` cannot read it. Real files, a real ``procsv`` process run as the
other user: the files belong to ``nobody``, and the command runs as root without the capabilities
that let root read anything (``setpriv`` drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its
bounding set), which is what a teammate is.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from conftest import REPO, quiet_env


AS_ANOTHER_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.fixture
def private_run(tmp_path_factory):
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux), to run the command as another user")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    logdir = tmp_path_factory.mktemp("shared") / "run"
    meta = logdir / ".procsv"
    (logdir / "logs").mkdir(parents=True)
    meta.mkdir()
    (meta / "status.json").write_text(json.dumps({"state": "succeeded", "step": 3, "processes": []}))
    (logdir / "logs" / "lifecycle.jsonl").write_text("")
    nobody = pwd.getpwnam("nobody")
    for p in (logdir / "logs", logdir / "logs" / "lifecycle.jsonl", meta, meta / "status.json"):
        os.chown(p, nobody.pw_uid, nobody.pw_gid)
    os.chmod(logdir / "logs", 0o700)
    os.chmod(meta, 0o700)
    return str(logdir)


@pytest.mark.parametrize("command", [("status",), ("status", "--json"), ("logs",), ("report",)])
def test_a_run_whose_files_another_user_cannot_read_is_one_line_and_exit_2(private_run, command):
    out = subprocess.run([*AS_ANOTHER_USER, sys.executable, "-m", "procsv", command[0], private_run, *command[1:]],
                         capture_output=True, text=True, env=quiet_env(), cwd=REPO, timeout=60)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("procsv: error: cannot read "), out.stderr
    assert "(Permission denied)" in lines[0] and "ask the run's owner for read access" in lines[0]
    assert "Traceback" not in out.stderr
