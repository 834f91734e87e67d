"""``logs/lifecycle.jsonl``: its one schema is enforced and documented, and a failing write never
ends the run (the watchdog reports it once and goes on); a child whose log cannot be opened still
starts. Real files (``/dev/full`` fails every write with ENOSPC) and real processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from procsv.watchdog.publish import events
from procsv.watchdog.publish.events import SCHEMA, Event, EventLog, SchemaError


def _documented() -> dict[str, set[str]]:
    """The event table of the module docstring: event name -> field names."""
    doc = events.__doc__ or ""
    rows: dict[str, set[str]] = {}
    body = doc.split("=====================  ")[2:]  # after the header's second rule
    for line in "".join(body).splitlines()[1:]:
        if line.startswith("====="):
            break
        if not line.strip():
            continue
        if line.startswith(" "):  # a continuation of the row above
            continue
        name, _, fields = line.partition(" ")
        fields = re.sub(r"\([^)]*\)", "", fields)
        rows[name] = {f.strip().replace(" ", "") for f in fields.split(",") if f.strip()}
    return rows


def test_the_documented_table_is_the_schema_the_writer_enforces():
    documented = _documented()
    enforced = {event.value: set(fields) for event, fields in SCHEMA.items()}
    assert set(documented) == {e.value for e in Event}, "every event is documented, none twice"
    assert documented == enforced


def test_a_record_with_a_field_missing_extra_or_both_alternatives_is_refused(tmp_path):
    log = EventLog(str(tmp_path / "lifecycle.jsonl"))
    with pytest.raises(SchemaError, match="finished"):
        log.write(Event.FINISHED, at=1.0, state="succeeded", exit_code=0)  # no step
    with pytest.raises(SchemaError, match="restarted"):
        log.write(Event.RESTARTED, at=1.0, attempt=2, why="extra")
    with pytest.raises(SchemaError, match="exactly one of"):
        log.write(Event.EXITED, at=1.0, role="trainer", attempt=1, pid=5, noticed=1.0, code=0, signal="SIGKILL")
    with pytest.raises(SchemaError, match="exactly one of"):
        log.write(Event.EXITED, at=1.0, role="trainer", attempt=1, pid=5, noticed=1.0)
    log.write(Event.EXITED, at=1.0, role="trainer", attempt=1, pid=5, noticed=1.0, signal="SIGKILL")
    log.close()
    with open(tmp_path / "lifecycle.jsonl") as fh:
        records = [json.loads(line) for line in fh]
    assert [r["event"] for r in records] == ["exited"]  # the refused ones wrote nothing
    assert records[0]["signal"] == "SIGKILL" and records[0]["time"] == 1.0


def test_a_lifecycle_file_that_cannot_be_written_is_reported_once_and_counted():
    said: list[str] = []
    log = EventLog("/dev/full", complain=said.append)  # every write fails with ENOSPC
    for attempt in (1, 2, 3):
        log.write(Event.RESTARTED, at=1.0, attempt=attempt)  # never raises
    log.close()
    assert log.lost == 3
    assert len(said) == 1
    assert "cannot append to /dev/full (No space left on device)" in said[0] and "the run goes on" in said[0]


def test_a_child_whose_log_cannot_be_opened_still_starts(tmp_path):
    missing = str(tmp_path / "gone" / "trainer.1.log")  # its folder does not exist
    code = "import sys; print('CHILD-OUT'); sys.stderr.write('CHILD-ERR\\n'); sys.exit(7)"
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; from procsv.common import spawn; "
         f"p = spawn.spawn([sys.executable, '-c', {code!r}], {{}}, {missing!r}); sys.exit(p.wait())"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 7  # the child ran to its own exit
    assert out.stderr.count("procsv: cannot open") == 1
    assert f"{missing} (No such file or directory); this process's output is discarded" in out.stderr
    assert "CHILD-OUT" not in out.stdout + out.stderr and "CHILD-ERR" not in out.stdout + out.stderr
