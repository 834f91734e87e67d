"""procsv.common.layout: atomic writes, tolerant JSON reads, logdir creation and the logdir lock."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from procsv.common.errors import LogdirLocked, UsageError
from procsv.common.layout import Layout, LogdirLock, atomic_write, read_json, write_json
from conftest import wait_for as _wait_for

LOCK_HOLDER = textwrap.dedent(
    """
    import sys, time
    from procsv.common.layout import Layout, LogdirLock
    lock = LogdirLock(Layout(sys.argv[1]))
    lock.acquire()
    print("locked", flush=True)
    time.sleep(120)
    """
)



def wait_for(condition, timeout=10.0):
    return _wait_for(condition, timeout, interval=0.01)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- atomic_write


@pytest.mark.parametrize("durable", [True, False])
def test_atomic_write_creates_file_and_leaves_no_temp_files(tmp_path, durable):
    target = tmp_path / "status.json"
    atomic_write(str(target), '{"a": 1}', durable=durable)
    assert target.read_bytes() == b'{"a": 1}'
    assert sorted(os.listdir(tmp_path)) == ["status.json"]


def test_atomic_write_replaces_existing_content(tmp_path):
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old content that is longer than the new one")
    atomic_write(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


def test_atomic_write_keeps_binary_data_exactly(tmp_path):
    data = bytes(range(256)) * 100
    target = tmp_path / "blob"
    atomic_write(str(target), data)
    assert target.read_bytes() == data


def test_atomic_write_file_mode_follows_the_umask(tmp_path):
    target = tmp_path / "status.json"
    atomic_write(str(target), "x")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~current_umask()


def test_failed_atomic_write_leaves_no_temp_file_and_keeps_target(tmp_path):
    target = tmp_path / "occupied"
    target.mkdir()
    (target / "inside").write_text("keep me")
    with pytest.raises(OSError):
        atomic_write(str(target), "data")
    assert sorted(os.listdir(tmp_path)) == ["occupied"]
    assert (target / "inside").read_text() == "keep me"


def test_atomic_write_relative_path_writes_in_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    atomic_write("plain.txt", "hi")
    assert (tmp_path / "plain.txt").read_text() == "hi"
    assert sorted(os.listdir(tmp_path)) == ["plain.txt"]


# ----------------------------------------------------------------------------- read_json


def test_write_json_then_read_json_round_trips(tmp_path):
    obj = {"state": "running", "pids": [1, 2], "nested": {"x": 1.5, "y": None}}
    path = str(tmp_path / "status.json")
    write_json(path, obj)
    assert read_json(path) == obj


def test_read_json_returns_none_for_missing_file(tmp_path):
    assert read_json(str(tmp_path / "nope.json")) is None


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"state": "runn', b"\xff\xfe\xfa\x00", b"{}{}"],
    ids=["empty", "garbage", "truncated", "binary", "two-objects"],
)
def test_read_json_returns_none_for_corrupt_file(tmp_path, content):
    path = tmp_path / "status.json"
    path.write_bytes(content)
    assert read_json(str(path)) is None


def test_read_json_returns_none_for_a_directory(tmp_path):
    assert read_json(str(tmp_path)) is None


# ----------------------------------------------------------------------------- Layout.create


def test_create_makes_all_procsv_folders_and_leaves_no_probe(tmp_path):
    layout = Layout(str(tmp_path / "run" / "nested"))
    layout.create()
    for path in (layout.logdir, layout.meta, layout.logs, layout.manifests, layout.tmp):
        assert os.path.isdir(path)
    assert sorted(os.listdir(layout.meta)) == ["checkpoints", "tmp"]


def test_create_is_idempotent(tmp_path):
    layout = Layout(str(tmp_path / "run"))
    layout.create()
    layout.create()
    assert os.path.isdir(layout.tmp)


def test_create_under_a_regular_file_raises_usage_error_naming_the_logdir(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("I am a file")
    logdir = str(blocker / "run")
    with pytest.raises(UsageError) as info:
        Layout(logdir).create()
    assert logdir in str(info.value)


def test_create_on_a_regular_file_raises_usage_error_naming_the_logdir(tmp_path):
    blocker = tmp_path / "run"
    blocker.write_text("I am a file")
    with pytest.raises(UsageError) as info:
        Layout(str(blocker)).create()
    assert str(blocker) in str(info.value)


# ----------------------------------------------------------------------------- LogdirLock


@pytest.fixture
def layout(tmp_path):
    lay = Layout(str(tmp_path / "logdir"))
    lay.create()
    return lay


def start_lock_holder(layout, out_path):
    out = open(out_path, "wb")
    try:
        return subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, layout.logdir], stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def kill(child):
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)


def test_holder_is_none_when_nobody_holds_the_lock(layout):
    assert LogdirLock.holder(layout) is None
    lock = LogdirLock(layout)
    lock.acquire()
    lock.release()
    assert LogdirLock.holder(layout) is None


def test_acquire_records_our_pid(layout):
    lock = LogdirLock(layout)
    lock.acquire()
    try:
        assert LogdirLock.holder(layout) == os.getpid()
        from procsv.common.pidfd import ProcessRecord, host_id, start_ticks

        with open(layout.lock) as fh:  # the pid, when it started, and where that pid means something
            pid, ticks, host, _ = fh.read().split()
        assert (int(pid), int(ticks), host) == (os.getpid(), start_ticks(os.getpid()), host_id())
        assert LogdirLock.held_by(layout) == ProcessRecord.mine()
    finally:
        lock.release()


def test_second_lock_on_the_same_logdir_in_the_same_process_is_refused(layout):
    first = LogdirLock(layout)
    first.acquire()
    try:
        with pytest.raises(LogdirLocked, match=str(os.getpid())):
            LogdirLock(layout).acquire()
    finally:
        first.release()
    second = LogdirLock(layout)
    second.acquire()
    second.release()


def test_lock_held_by_a_live_process_is_refused_and_taken_over_after_it_is_killed(layout, tmp_path):
    out_path = tmp_path / "holder.out"
    child = start_lock_holder(layout, out_path)
    mine = LogdirLock(layout)
    try:
        wait_for(lambda: b"locked" in out_path.read_bytes() or child.poll() is not None)
        assert child.poll() is None, out_path.read_bytes().decode(errors="replace")
        assert LogdirLock.holder(layout) == child.pid

        with pytest.raises(LogdirLocked) as info:
            mine.acquire()
        assert f"pid {child.pid}" in str(info.value)
        assert layout.logdir in str(info.value)

        kill(child)
        wait_for(lambda: LogdirLock.holder(layout) is None)
        mine.acquire()
        assert LogdirLock.holder(layout) == os.getpid()
        with open(layout.lock) as fh:
            assert fh.read().split()[0] == str(os.getpid())
    finally:
        kill(child)
        mine.release()


def test_an_error_record_the_logdir_cannot_take_goes_to_the_runtime_dir_where_the_watchdog_reads_it(tmp_path):
    from procsv.common.bootstrap import write_error_record
    from procsv.common.layout import spilled_error_file
    from procsv.watchdog.children import read_child_error

    layout = Layout(str(tmp_path / "run"))
    os.makedirs(layout.logdir)
    with open(layout.logs, "w") as fh:  # logs/ is a file: every write under it fails (ENOTDIR)
        fh.write("x")
    runtime = tmp_path / "rt"
    runtime.mkdir()
    try:
        raise RuntimeError("disk full, probably")
    except RuntimeError as exc:
        write_error_record(layout, "trainer", 2, exc, "run", str(runtime))
    paths = (layout.error_file("trainer", 2), spilled_error_file(str(runtime), "trainer", 2))
    assert not os.path.exists(paths[0]) and os.path.exists(paths[1])
    err = read_child_error(paths, os.getpid())
    assert err is not None and err.type == "RuntimeError" and err.message == "disk full, probably"
    assert "raise RuntimeError" in err.traceback
    assert read_child_error(paths, os.getpid() + 1) is None  # another process's record is not ours
