"""Capture what a terminal shows of a run: the live line of ``procsv launch`` and ``procsv status
--watch``, each on its own pseudo-terminal, plus the report picture. Makes docs/live-line.txt and
docs/report.png.

    .venv/bin/python scripts/capture_live.py [--out-text docs/live-line.txt] [--out-png docs/report.png]

It launches ``procsv.examples.digits`` (4,000 steps, 5 ms a step, a checkpoint every 300 steps),
SIGKILLs the trainer at step 700 and 2600 and preempts it at step 1500 (SIGTERM: it saves and exits 42) with
``procsv preempt``, and renders both byte streams through a tiny terminal model (carriage return,
erase line, clear screen, newline) into text "screenshots" taken at chosen moments.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time

COLUMNS, ROWS = 150, 30
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")


def screen(data: str, rows: int = ROWS) -> str:
    """The last ``rows`` lines a terminal shows after ``data`` (CR, LF, ESC[K, ESC[H ESC[J only)."""
    lines: list[str] = []
    cur: list[str] = []
    col, i = 0, 0
    while i < len(data):
        if data.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
        elif data.startswith("\x1b[H\x1b[J", i):
            lines, cur, col = [], [], 0
            i += 6
        elif data[i] == "\r":
            col, i = 0, i + 1
        elif data[i] == "\n":
            lines.append("".join(cur))
            cur, col, i = [], 0, i + 1
        else:
            if col < len(cur):
                cur[col] = data[i]
            else:
                cur.append(data[i])
            col, i = col + 1, i + 1
    return "\n".join((lines + ["".join(cur)])[-rows:]).rstrip("\n")


def _step(logdir: str) -> int:
    try:
        with open(os.path.join(logdir, ".procsv", "status.json")) as fh:
            return int(json.load(fh).get("step") or 0)
    except (OSError, ValueError):
        return 0


def on_pty(cmd: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=ENV, start_new_session=True)
    os.close(slave)
    return proc, master


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-text", default="docs/live-line.txt")
    p.add_argument("--out-png", default="docs/report.png")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="procsv-capture-")
    logdir = os.path.join(work, "digits")
    exe = [sys.executable, "-m", "procsv"]
    launch, lm = on_pty(exe + ["launch", "procsv.examples.digits", "--logdir", logdir, "--", "--steps", "4000",
                               "--step-delay", "0.005", "--save-checkpoint-steps", "300", "--print-every-steps", "500"])
    streams = {lm: b""}  # open fds and what they wrote
    bufs = streams.copy()  # everything each wrote (kept after its fd closes)
    marks: dict[str, int] = {}
    watch = None
    wm = -1
    plan = [(700, "KILL"), (1500, "TERM"), (2600, "KILL")]  # at these steps (status.json's)
    first_step_at = None
    try:
        while launch.poll() is None or any(select.select([fd], [], [], 0)[0] for fd in streams):
            ready, _, _ = select.select(list(streams), [], [], 0.1)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    del streams[fd]
                    continue
                streams[fd] += data
                bufs[fd] = streams[fd]
            text = streams.get(lm, b"")
            if first_step_at is None and b"| step " in text and b"| step 0 |" not in text.rsplit(b"\r", 1)[-1]:
                first_step_at = time.monotonic()
                watch, wm = on_pty(exe + ["status", logdir, "--watch"])
                streams[wm] = bufs[wm] = b""
            if first_step_at is not None and plan and _step(logdir) >= plan[0][0]:
                _, sig = plan.pop(0)
                subprocess.run(exe + ["preempt", logdir, "--target", "trainer", "--signal", sig], env=ENV,
                               capture_output=True, timeout=60)
            for name, needle in (("restored", b"| restored step"), ("later", b"| checkpoint step 3300 ")):
                if name not in marks and lm in streams and needle in streams[lm]:
                    # the end of the frame that first shows it
                    end = streams[lm].find(b"\r", streams[lm].find(needle))
                    if end > 0:
                        marks[name] = end
                        if wm in streams:
                            marks["watch-" + name] = len(streams[wm])
            if lm not in streams and launch.poll() is not None:
                break
        launch.wait()
        if watch is not None:
            watch.wait(timeout=30)
            while wm in streams:
                try:
                    data = os.read(wm, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                streams[wm] += data
                bufs[wm] = streams[wm]
    finally:
        for proc in (launch, watch):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 9)
    full = bufs.get(lm, b"")
    wtext = bufs.get(wm, b"")
    out = ["# A terminal running `procsv launch procsv.examples.digits` (150 columns), captured through a pty",
           "# by scripts/capture_live.py; the last line is the live line, redrawn in place.", ""]
    for name in ("restored", "later"):
        if name in marks:
            out += [f"## launch, just after {'the first restart' if name == 'restored' else 'a later commit'}", "",
                    screen(full[:marks[name]].decode("utf-8", "replace"), 14), ""]
            w = marks.get("watch-" + name)
            if w:
                out += ["## `procsv status DIR --watch` on another terminal, at the same moment", "",
                        screen(wtext[:w].decode("utf-8", "replace"), 20), ""]
    out += [f"## launch exit code: {launch.returncode}", ""]
    with open(args.out_text, "w") as fh:
        fh.write("\n".join(out).replace(logdir, "runs/digits"))
    done = subprocess.run(exe + ["report", logdir, "--plot", args.out_png], env=ENV, capture_output=True, text=True)
    print(done.stdout, done.stderr)
    with open(args.out_text, "a") as fh:
        fh.write("## `procsv report DIR --plot docs/report.png` afterwards\n\n"
                 + done.stdout.replace(logdir, "runs/digits").replace(os.path.abspath(args.out_png), args.out_png))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if launch.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
