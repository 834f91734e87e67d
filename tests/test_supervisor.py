"""The Supervisor's block semantics in a plain `python train.py` run (services started for it)."""

from __future__ import annotations


import pytest

from conftest import PROGRAMS, committed_steps, quiet_env, run_processes, run_python

pytestmark = pytest.mark.slow
TINY = f"{PROGRAMS}/tiny_train.py"


@pytest.mark.parametrize("kind", ["outofrange", "stopiteration"])
def test_exhausted_input_is_a_clean_stop_with_a_final_checkpoint(logdir, kind):
    out = run_python([TINY, "--logdir", logdir, "--steps", "50", "--step-delay", "0", "--raise-at-step", "7",
                      "--raise-kind", kind], env=quiet_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    assert "tiny: done at step 6, weights 6" in out.stdout  # step 7 raised, so 6 steps completed
    assert committed_steps(logdir) == [6]
    assert not run_processes(logdir)


def test_any_other_exception_is_re_raised_after_the_services_stopped_and_saves_nothing(logdir):
    out = run_python([TINY, "--logdir", logdir, "--steps", "50", "--step-delay", "0", "--raise-at-step", "7",
                      "--raise-kind", "value"], env=quiet_env(), timeout=180)
    assert out.returncode == 1
    assert "ValueError: bad batch at step 7" in out.stderr
    assert committed_steps(logdir) == []  # the state after a failed step is not trusted
    assert not run_processes(logdir)
