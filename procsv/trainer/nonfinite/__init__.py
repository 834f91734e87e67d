"""Non-finite training state, in the trainer: detection of a non-finite loss, the refusal of a
poisoned snapshot, and the ``--on-nonfinite`` policy (issue 41).

Runs in the trainer's main thread. :mod:`.policy` is pure (the policy's name and bounds),
:mod:`.losses` keeps each step's loss and checks them in bulk, :mod:`.scan` checks a snapshot's
copy in the snapshot memory, :mod:`.watch` ties them to a Supervisor.
"""
