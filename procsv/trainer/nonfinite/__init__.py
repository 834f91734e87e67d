"""Non-finite training state, in the trainer: detection of a non-finite loss, the refusal of a
poisoned snapshot, and the ``--on-nonfinite`` policy (issue 41).

Runs in the trainer's main thread. :mod:`.policy` is pure (the policy's name and bounds),
:mod:`.losses` keeps each step's loss and checks them in bulk, :mod:`.scan` checks a snapshot's
copy in the snapshot memory, :mod:`.watch` ties them to a Supervisor, :mod:`.rollback` restores in place and
:mod:`.boundary_work` walks the replay, retry and skip through the step boundaries as the pure
:mod:`.plan` decides; :mod:`.retry` is where the rollback stands, changed through its own transitions.
"""
