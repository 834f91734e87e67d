"""Where each of a program's ``fit`` calls begins after its restore (:mod:`procsv.trainer.keras.resume`), pure.

A program may call ``fit`` more than once with one backup directory. Before, a fit restored whatever
position the newest checkpoint held: the second fit of a program "resumed" the completed first
(issue 67: ``fit resumes at epoch 10, batch 51`` of a 47-batch epoch), and after a kill in the second
fit the restarted program's first fit resumed the second's position.
"""

from __future__ import annotations

import pytest

from procsv.trainer.keras.resume import FITS_SHIFT, Begin, begin, pack, unpack, whole_epochs


def test_a_position_packs_the_fits_before_it_with_its_epoch_and_an_older_procsvs_epoch_reads_as_the_first_fits():
    for fits, epoch in ((0, 0), (0, 9), (1, 0), (3, 41), (7, 2**31)):
        assert unpack(pack(fits, epoch)) == (fits, epoch)
    assert unpack(12) == (0, 12)  # fit/epoch as an older procsv wrote it: the epoch alone
    assert pack(2, 5) == 2 * 2**FITS_SHIFT + 5


def test_nothing_restored_begins_at_the_fits_own_first_epoch():
    assert begin(0, None, 8) == Begin(None, 0, 0)
    assert begin(2, None, None) == Begin(None, 0, 2)


def test_a_fit_after_a_completed_fit_begins_at_its_own_first_epoch_not_where_the_completed_one_ended():
    # the first fit's final commit recorded the position past its last epoch: (fits 0, epoch 4, batch 0)
    where = begin(1, (0, 4, 0), 8)
    assert where == Begin(None, 0, 1) and not where.resumes
    assert begin(1, (0, 3, 6), 8) == Begin(None, 0, 1)  # (an older procsv's final commit: the last epoch's end)
    assert begin(1, (1, 0, 0), 8) == Begin(None, 0, 1)  # its own beginning


def test_a_completed_fit_rerun_resumes_past_its_last_epoch_so_more_epochs_train_only_the_added_ones():
    assert begin(0, (0, 4, 0), 6) == Begin(4, 0, 0)


def test_a_restarted_programs_fit_that_completed_before_the_kill_trains_nothing():
    where = begin(0, (1, 2, 3), 6)  # the first fit, restoring the second's epoch 2, batch 3
    assert where.passed and not where.resumes and where.fits == 1 and (where.epoch, where.batch) == (2, 3)
    assert begin(0, (2, 0, 0), 6).passed  # the program's third fit had begun


def test_the_fit_that_was_killed_resumes_where_it_was():
    assert begin(1, (1, 2, 3), 8) == Begin(2, 3, 1)
    assert begin(0, (0, 2, 0), 8) == Begin(2, 0, 0)
    assert begin(0, (0, 0, 5), 8).resumes  # inside its first epoch


@pytest.mark.parametrize("batch", [8, 9, 51])
def test_a_resume_position_never_lies_at_or_past_the_end_of_the_epochs_batches(batch):
    assert whole_epochs(3, batch, 8) == (4, 0)
    assert begin(0, (0, 3, batch), 8) == Begin(4, 0, 0)
    assert whole_epochs(3, 7, 8) == (3, 7)
    assert whole_epochs(3, batch, None) == (3, batch)  # the epoch's batches not known: as recorded


def test_a_state_of_an_earlier_fit_begins_the_fit_at_its_first_epoch():
    assert begin(2, (1, 3, 4), 8) == Begin(None, 0, 2)
    assert begin(2, (0, 4, 0), None) == Begin(None, 0, 2)
