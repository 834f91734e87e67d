"""The trainer's side of checkpoints: restore at start, snapshots at step boundaries, the in-memory
tier, the hand-off to the checkpoint service and the bookkeeping of commits. Runs in the trainer's
main thread.
"""
