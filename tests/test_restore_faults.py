"""Restore under read faults, in one process: corrupt vs unreadable, the retry, refusing step 0, quarantine.

Real checkpoints (the snapshot -> store harness of test_checkpoint_store.py) and the trainer's real
``CheckpointAgent``; the retry runs on a fake clock. The tests run as root, so ``chmod`` cannot make
a file unreadable: a data file is replaced by a directory of the same name (EISDIR), or ``open`` is
made to fail with EIO/EACCES for one path.
"""

from __future__ import annotations

import builtins
import errno
import os

import pytest

from procsv.common.errors import (CheckpointError, CorruptCheckpoint, NoRestorableCheckpoint, ProcsvError,
                                  UnreadableCheckpoint)
from procsv.common.layout import Layout
from procsv.common.manifests import Manifest, list_committed, verify
from procsv.trainer.checkpoint import restore
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.restore import ReadRetry
from test_checkpoint_store import Harness, make_state


@pytest.fixture(autouse=True)
def preempt_signal_taken_back(monkeypatch):  # type: ignore[no-untyped-def]
    """The launch's configuration, built in this process by some tests here, sets PROCSV_PREEMPT_SIGNAL
    for the children it would start: taken away after each test (conftest.procsv_environment_unchanged)."""
    monkeypatch.setenv("PROCSV_PREEMPT_SIGNAL", "")
    monkeypatch.delenv("PROCSV_PREEMPT_SIGNAL")



class FakeTime:
    """A monotonic clock that only ``sleep`` advances; records every pause."""

    def __init__(self) -> None:
        self.t = 100.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, secs: float) -> None:
        self.pauses.append(secs)
        self.t += secs


def _files_of(layout: Layout, m: Manifest) -> dict[str, bytes]:
    out = {}
    for name in m.files:
        path = os.path.join(layout.logdir, name)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                out[name] = fh.read()
    return out


def _flip(path: str, at: int = 40) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _data_file(layout: Layout, m: Manifest) -> str:
    return os.path.join(layout.logdir, sorted(n for n in m.files if ".data-" in n)[0])


def _make_dir_in_place_of(path: str) -> None:
    """EISDIR for a reader: the file moved aside (kept for the test) and a directory in its place."""
    os.rename(path, path + ".aside")
    os.mkdir(path)


def _undo_dir(path: str) -> None:
    os.rmdir(path)
    os.rename(path + ".aside", path)


@pytest.fixture
def saved(tmp_path):
    """A logdir with checkpoints at steps 10, 20, 30 of make_state's state (plus a global_step)."""
    import tensorflow as tf

    ckpt, state, _ = make_state(tf)
    ckpt.global_step = state["step"]
    h = Harness(str(tmp_path / "run"))
    for step in (10, 20, 30):
        state["step"].assign(step)
        h.save(ckpt, step)
    return h


def _agent(layout: Layout, fake: FakeTime, allow_reinit: bool = False, shape: tuple[int, int] = (33, 17),
           total_secs: float = 2.0) -> tuple[CheckpointAgent, object]:
    import tensorflow as tf

    if shape == (33, 17):
        ckpt, state, _ = make_state(tf)
    else:  # the program changed: ``w`` has another shape now
        state = {"w": tf.Variable(tf.zeros(shape), name="w_resized"), "step": tf.Variable(0, dtype=tf.int64)}
        ckpt = tf.train.Checkpoint(**state)
    ckpt.global_step = state["step"]
    agent = CheckpointAgent(ckpt, state["step"], layout, basename="model.ckpt", save_model_secs=None,
                            save_checkpoint_steps=None, max_to_keep=5, keep_checkpoint_every_n_hours=None,
                            allow_reinit=allow_reinit, read_retry=ReadRetry(total_secs=total_secs),
                            clock=fake.clock, sleep=fake.sleep)
    return agent, state


# ------------------------------------------------------------------ verify: corrupt vs unreadable
def test_a_directory_in_place_of_a_data_file_is_unreadable_not_corrupt(saved):
    m = list_committed(saved.layout)[-1]
    data = _data_file(saved.layout, m)
    _make_dir_in_place_of(data)
    with pytest.raises(UnreadableCheckpoint, match=r"model.ckpt-30: file model.ckpt-30.data-\S+ cannot be read "
                                                   r"\(EISDIR") as info:
        verify(saved.layout, m)
    assert not isinstance(info.value, CorruptCheckpoint)
    assert info.value.errno == errno.EISDIR and info.value.path == os.path.basename(data)
    with pytest.raises(UnreadableCheckpoint):
        verify(saved.layout, m, full=False)


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES, errno.ESTALE])
def test_an_os_error_other_than_enoent_on_open_is_unreadable_naming_file_and_errno(saved, monkeypatch, code):
    m = list_committed(saved.layout)[-1]
    index = os.path.join(saved.layout.logdir, "model.ckpt-30.index")
    real_open, real_os_open = builtins.open, os.open

    def failing_open(file, *args, **kwargs):
        if os.fspath(file) == index:
            raise OSError(code, os.strerror(code), index)
        return real_open(file, *args, **kwargs)

    def failing_os_open(path, *args, **kwargs):
        if os.fspath(path) == index:
            raise OSError(code, os.strerror(code), index)
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", failing_open)
    monkeypatch.setattr(os, "open", failing_os_open)
    with pytest.raises(UnreadableCheckpoint, match=f"file model.ckpt-30.index cannot be read "
                                                   f"\\({errno.errorcode[code]}: ") as info:
        verify(saved.layout, m)
    assert info.value.errno == code


def test_an_eio_while_reading_is_unreadable(saved, monkeypatch):
    m = list_committed(saved.layout)[-1]
    data = _data_file(saved.layout, m)
    real_open = builtins.open

    class EioFile:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def fileno(self):
            return self.fh.fileno()

        def readinto(self, buf):
            raise OSError(errno.EIO, os.strerror(errno.EIO), data)

        def read(self, *args):
            raise OSError(errno.EIO, os.strerror(errno.EIO), data)

    def eio_open(file, *args, **kwargs):
        fh = real_open(file, *args, **kwargs)
        return EioFile(fh) if os.fspath(file) == data else fh

    monkeypatch.setattr(builtins, "open", eio_open)
    with pytest.raises(UnreadableCheckpoint, match=r"cannot be read \(EIO"):
        verify(saved.layout, m)


def test_missing_truncated_and_altered_files_are_corrupt_even_next_to_an_unreadable_one(saved):
    layout = saved.layout
    m10, m20, m30 = list_committed(layout)
    os.unlink(os.path.join(layout.logdir, "model.ckpt-10.index"))
    with pytest.raises(CorruptCheckpoint, match="model.ckpt-10: file model.ckpt-10.index is missing"):
        verify(layout, m10)
    data = _data_file(layout, m20)
    os.truncate(data, os.path.getsize(data) - 3)
    with pytest.raises(CorruptCheckpoint, match="bytes, .* were committed"):
        verify(layout, m20)
    _make_dir_in_place_of(_data_file(layout, m30))  # unreadable, and checked first (sorted names)
    _flip(os.path.join(layout.logdir, "model.ckpt-30.index"))  # corrupt, checked last
    with pytest.raises(CorruptCheckpoint, match="fails its CRC-32C check"):
        verify(layout, m30)


# ------------------------------------------------------------------ the choice, pure
def _manifests(*steps: int) -> list[Manifest]:
    return [Manifest(s, f"model.ckpt-{s}", {}, float(s), "test") for s in steps]


def test_a_transient_unreadable_file_is_retried_with_backoff_and_the_newest_is_restored():
    fake = FakeTime()
    calls: list[int] = []

    def attempt(m: Manifest) -> None:
        calls.append(m.step)
        if len(calls) <= 3:
            raise UnreadableCheckpoint(f"{m.prefix}: file x cannot be read (EIO: Input/output error)")

    choice = restore.choose(_manifests(10, 20, 30), attempt, allow_reinit=False, clock=fake.clock, sleep=fake.sleep)
    assert choice.restored is not None and choice.restored.step == 30 and choice.corrupt == []
    assert calls == [30, 30, 30, 30] and fake.pauses == [0.1, 0.2, 0.4]


def test_a_lasting_unreadable_file_fails_after_the_retry_time_and_never_falls_back_or_initializes():
    fake = FakeTime()
    calls: list[int] = []

    def attempt(m: Manifest) -> None:
        calls.append(m.step)
        if m.step == 30:
            raise CorruptCheckpoint(f"{m.prefix}: file model.ckpt-30.index is missing")
        raise UnreadableCheckpoint(f"{m.prefix}: file {m.prefix}.index cannot be read (EIO: Input/output error)",
                                   path=f"{m.prefix}.index", errno=errno.EIO)

    with pytest.raises(UnreadableCheckpoint) as info:
        restore.choose(_manifests(10, 20, 30), attempt, allow_reinit=True, retry=ReadRetry(total_secs=3.0),
                       clock=fake.clock, sleep=fake.sleep)
    assert set(calls) == {30, 20}  # the older one is never tried in place of one that may be intact
    assert sum(fake.pauses) <= 3.0 and fake.t - 100.0 > 2.0 and max(fake.pauses) == 1.0
    lines = str(info.value).splitlines()
    assert lines[0].startswith("cannot read checkpoint model.ckpt-20; ")
    assert lines[1] == "  model.ckpt-30 (step 30): corrupt: model.ckpt-30: file model.ckpt-30.index is missing"
    assert lines[2].startswith("  model.ckpt-20 (step 20): unreadable: model.ckpt-20: file model.ckpt-20.index "
                               "cannot be read (EIO: Input/output error) (still after ")
    assert lines[3].startswith("  model.ckpt-10 (step 10): not tried")
    assert info.value.errno == errno.EIO and info.value.path == "model.ckpt-20.index"


def test_every_checkpoint_corrupt_refuses_step_0_with_one_line_each_unless_allowed():
    def attempt(m: Manifest) -> None:
        raise CorruptCheckpoint(f"{m.prefix}: file {m.prefix}.index fails its CRC-32C check (altered after commit)")

    seen: list[str] = []
    with pytest.raises(NoRestorableCheckpoint) as info:
        restore.choose(_manifests(10, 20), attempt, allow_reinit=False, on_corrupt=lambda m, why: seen.append(m.prefix))
    assert isinstance(info.value, ProcsvError) and seen == ["model.ckpt-20", "model.ckpt-10"]
    lines = str(info.value).splitlines()
    assert lines[0].startswith("refusing to start from step 0: none of the 2 committed checkpoints can be restored")
    assert lines[1:3] == [
        "  model.ckpt-20 (step 20): corrupt: model.ckpt-20: file model.ckpt-20.index fails its CRC-32C check "
        "(altered after commit)",
        "  model.ckpt-10 (step 10): corrupt: model.ckpt-10: file model.ckpt-10.index fails its CRC-32C check "
        "(altered after commit)"]
    assert "--allow-reinit" in lines[3]
    choice = restore.choose(_manifests(10, 20), attempt, allow_reinit=True)
    assert choice.restored is None and [m.step for m, _ in choice.corrupt] == [20, 10]
    assert restore.choose([], attempt, allow_reinit=False) == restore.Choice(None, [])


def test_the_retry_delays_grow_and_are_capped():
    r = ReadRetry(total_secs=10, first_delay=0.1, factor=2.0, max_delay=1.0)
    assert [r.delay(k) for k in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


# ------------------------------------------------------------------ the trainer's agent, real TF
def test_agent_with_every_checkpoint_unreadable_raises_and_neither_initializes_nor_touches_a_file(saved):
    layout = saved.layout
    committed = list_committed(layout)
    before = {m.prefix: _files_of(layout, m) for m in committed}
    for m in committed:
        _make_dir_in_place_of(_data_file(layout, m))
    fake = FakeTime()
    agent, _ = _agent(layout, fake)
    inits: list[int] = []
    with pytest.raises(UnreadableCheckpoint, match=r"(?s)cannot read checkpoint model.ckpt-30.*EISDIR") as info:
        agent.restore_or_init(lambda: inits.append(1))
    assert inits == [] and agent.restored_from is None
    assert fake.pauses and sum(fake.pauses) <= 2.0
    assert "model.ckpt-10 (step 10): not tried" in str(info.value)
    for m in committed:
        _undo_dir(_data_file(layout, m))
    assert {m.prefix: _files_of(layout, m) for m in list_committed(layout)} == before
    agent2, state = _agent(layout, FakeTime())
    agent2.restore_or_init(lambda: inits.append(1))  # readable again: the newest is restored
    assert inits == [] and int(state["step"].numpy()) == 30


def test_agent_with_every_checkpoint_corrupt_refuses_then_initializes_when_allowed(saved):
    layout = saved.layout
    committed = list_committed(layout)
    for m in committed:
        _flip(_data_file(layout, m))
    inits: list[int] = []
    agent, _ = _agent(layout, FakeTime())
    with pytest.raises(NoRestorableCheckpoint, match="refusing to start from step 0") as info:
        agent.restore_or_init(lambda: inits.append(1))
    assert inits == [] and len(str(info.value).splitlines()) == 1 + 3 + 1
    assert [m.step for m in list_committed(layout)] == [10, 20, 30]
    agent, state = _agent(layout, FakeTime(), allow_reinit=True)
    assert agent.restore_or_init(lambda: inits.append(1)) == ["model.ckpt-30", "model.ckpt-20", "model.ckpt-10"]
    assert inits == [1] and agent.restored_from is None and int(state["step"].numpy()) == 0


def test_agent_falls_back_past_a_corrupt_newest_checkpoint(saved):
    layout = saved.layout
    _flip(_data_file(layout, list_committed(layout)[-1]))
    agent, state = _agent(layout, FakeTime())
    assert agent.restore_or_init(lambda: pytest.fail("initialized")) == ["model.ckpt-30"]
    assert agent.restored_from.endswith("model.ckpt-20") and int(state["step"].numpy()) == 20


def test_a_changed_variable_shape_is_an_error_naming_the_variable_not_a_reinit(saved):
    agent, _ = _agent(saved.layout, FakeTime(), allow_reinit=True, shape=(33, 18))
    mismatch = r"model.ckpt-30 does not match this program's state \(.*w_resized"
    with pytest.raises(CheckpointError, match=mismatch) as info:
        agent.restore_or_init(lambda: pytest.fail("initialized"))
    assert not isinstance(info.value, (CorruptCheckpoint, UnreadableCheckpoint, NoRestorableCheckpoint))
    assert type(info.value).__name__ == "MismatchedCheckpoint"  # the watchdog gives up on it at once
    assert [m.step for m in list_committed(saved.layout)] == [10, 20, 30]


# ------------------------------------------------------------------ the service: quarantine, never delete
def test_corrupt_checkpoints_are_quarantined_not_deleted_and_unreadable_ones_stay(saved):
    import tensorflow as tf

    layout = saved.layout
    m10, m20, m30 = list_committed(layout)
    saved_files = _files_of(layout, m30)
    _flip(_data_file(layout, m30))
    damaged = _files_of(layout, m30)
    _make_dir_in_place_of(_data_file(layout, m20))
    notes = saved.store.quarantine_corrupt_after(10)
    assert len(notes) == 2
    assert notes[0].startswith("kept checkpoint model.ckpt-20, newer than the restored step 10: ")
    assert "EISDIR" in notes[0]
    folder = os.path.join(layout.meta, "quarantine", "model.ckpt-30")
    assert folder == layout.quarantined("model.ckpt-30")
    assert notes[1].startswith("quarantined corrupt checkpoint model.ckpt-30 (model.ckpt-30: file ")
    assert notes[1].endswith(f"moved its manifest and 3 file(s) to {folder}; nothing was deleted")
    assert sorted(os.listdir(folder)) == sorted([*m30.files, "model.ckpt-30.json"])
    for name, data in damaged.items():
        with open(os.path.join(folder, name), "rb") as fh:
            assert fh.read() == data
    assert saved_files != damaged
    assert [m.step for m in list_committed(layout)] == [10, 20]
    assert tf.train.latest_checkpoint(layout.logdir).endswith("model.ckpt-20")
    _undo_dir(_data_file(layout, m20))
    verify(layout, list_committed(layout)[-1])
    ckpt, state, _ = make_state(tf)
    saved.save(ckpt, 30)  # the step commits again, and a second quarantine of it gets its own folder
    _flip(_data_file(layout, list_committed(layout)[-1]))
    (note,) = saved.store.quarantine_corrupt_after(20)
    assert note.endswith(f"to {folder}.2; nothing was deleted") and len(os.listdir(folder)) == 4
    assert len(os.listdir(folder + ".2")) == 4


def test_a_damaged_committed_step_is_quarantined_before_it_is_written_again(saved, capsys):
    import tensorflow as tf

    layout = saved.layout
    m30 = list_committed(layout)[-1]
    data = _data_file(layout, m30)
    os.truncate(data, os.path.getsize(data) - 1)
    ckpt, _, _ = make_state(tf)
    saved.save(ckpt, 30)
    verify(layout, list_committed(layout)[-1])
    assert "quarantined corrupt checkpoint model.ckpt-30" in capsys.readouterr().err
    assert sorted(os.listdir(layout.quarantined("model.ckpt-30"))) == sorted([*m30.files, "model.ckpt-30.json"])


def test_an_unreadable_committed_step_fails_the_save_and_is_kept(saved):
    import tensorflow as tf

    layout = saved.layout
    m30 = list_committed(layout)[-1]
    data = _data_file(layout, m30)
    _make_dir_in_place_of(data)
    ckpt, _, _ = make_state(tf)
    with pytest.raises(UnreadableCheckpoint, match="EISDIR"):
        saved.save(ckpt, 30)
    _undo_dir(data)
    verify(layout, list_committed(layout)[-1])
    assert not os.path.exists(layout.quarantine) or os.listdir(layout.quarantine) == []
    assert os.listdir(layout.tmp) == []


# ------------------------------------------------------------------ asking for step 0: the flag and the argument
def test_launch_allow_reinit_reaches_the_launch_config(monkeypatch, tmp_path):
    from procsv import cli
    from procsv.watchdog import launcher

    seen = []

    class FakeWatchdog:
        def __init__(self, cfg, born=None, seed=None):  # born: when the launch began
            seen.append(cfg.allow_reinit)

        def run(self):
            return 0

    monkeypatch.setattr(launcher, "Watchdog", FakeWatchdog)
    logdir = str(tmp_path / "run")
    assert cli.main(["launch", "procsv.examples.digits", "--logdir", logdir, "--allow-reinit"]) == 0
    assert cli.main(["launch", "procsv.examples.digits", "--logdir", logdir]) == 0
    assert seen == [True, False]


@pytest.mark.parametrize("arg,env_value,expected", [(None, None, False), (None, "1", True), (None, "0", False),
                                                    (True, None, True), (True, "0", True), (False, None, False),
                                                    (False, "1", False)])
def test_supervisor_allow_reinit_comes_from_the_argument_else_the_launch(monkeypatch, tmp_path, arg, env_value,
                                                                       expected):
    # the one precedence rule (bootstrap.resolve): an explicit allow_reinit=False is kept under --allow-reinit
    # (before: either turned it on)
    import tensorflow as tf

    import procsv
    from procsv.common import env

    for name in (env.LOGDIR, env.RUNTIME_DIR):
        monkeypatch.delenv(name, raising=False)
    if env_value is None:
        monkeypatch.delenv(env.ALLOW_REINIT, raising=False)
    else:
        monkeypatch.setenv(env.ALLOW_REINIT, env_value)
    sv = procsv.Supervisor(logdir=str(tmp_path / "run"), checkpoint={"w": tf.Variable([1.0])}, allow_reinit=arg,
                           read_retry_secs=0.5)
    assert sv.allow_reinit is expected and sv._keeper.agent.restore_rules.allow_reinit is expected
    assert sv._keeper.agent.restore_rules.read_retry.total_secs == 0.5
