"""The live status line of ``procsv launch``, read through a real pseudo-terminal; none on a pipe
or with ``--quiet``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import PROGRAMS, REPO, finish, launch, quiet_env

pytestmark = pytest.mark.slow
TINY = os.path.join(PROGRAMS, "tiny_train.py")
ERASE = b"\r\x1b[K"
COLUMNS = 160


def launch_on_pty(logdir: str, *args: str, opts: tuple[str, ...] = (), timeout: float = 180) -> tuple[int, bytes]:
    """Run ``procsv launch`` with stdin, stdout and stderr on a pty's slave; everything it wrote to
    the terminal, read from the master, and its exit code."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    cmd = [sys.executable, "-m", "procsv", "launch", TINY, "--logdir", logdir, *opts, "--", *args]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=quiet_env(), cwd=REPO,
                            start_new_session=True)
    os.close(slave)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the slave
                    break
                if not data:
                    break
                buf += data
            elif proc.poll() is not None:
                break
        else:
            raise AssertionError(f"launch on a pty did not end in {timeout} s:\n{buf[-2000:]!r}")
        return proc.wait(timeout=30), buf
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def frames(buf: bytes) -> list[str]:
    """The live lines drawn: the text after each erase, up to the next erase or line end."""
    out = []
    for chunk in buf.split(ERASE)[1:]:
        text = chunk.decode("utf-8", "replace")
        if text.startswith("procsv | step ") and "\n" not in text:
            out.append(text)
    return out


def test_the_live_line_redraws_in_place_on_a_terminal_with_output_above_it(logdir):
    code, buf = launch_on_pty(logdir, "--steps", "600", "--step-delay", "0.01", "--save-steps", "100")
    assert code == 0, buf[-3000:]
    drawn = frames(buf)
    steps = [int(re.match(r"procsv \| step (\d+)", f).group(1)) for f in drawn]  # type: ignore[union-attr]
    assert len(set(steps)) >= 5 and steps == sorted(steps) and steps[-1] == 600, drawn
    assert all(len(f) < COLUMNS for f in drawn)
    assert any(" steps/s | checkpoint " in f and " restarts 0 | goodput " in f for f in drawn)
    assert any(re.search(r"checkpoint step \d+ committed in", f) for f in drawn)
    assert any(re.search(r"\| checkpoint \d+ s ago \|", f) for f in drawn)  # the age of the last commit
    # the trainer's output scrolls above: the line is erased, the output printed, the line drawn again
    assert re.search(rb"\r\x1b\[K\[trainer\.1\] tiny: attempt 1 starts at step 0\r\n\r\x1b\[Kprocsv \| step", buf)
    assert buf.endswith(ERASE)  # the line is erased when the launch ends


def test_no_live_line_on_a_pipe_or_with_quiet(logdir):
    proc = launch(logdir, "--steps", "200", "--step-delay", "0.01", target=TINY)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "tiny: done at step 200" in out
    for text in (out, err):
        assert "\x1b[" not in text and "\r" not in text and "procsv | step" not in text
    code, buf = launch_on_pty(logdir, "--steps", "400", "--step-delay", "0.01", opts=("--quiet",))
    assert code == 0, buf[-3000:]
    assert b"\x1b[" not in buf and b"procsv | step" not in buf and b"[trainer.1]" not in buf
    assert b"procsv: trainer finished at step 400" in buf
