"""A trainer that prepares before it is needed: the hot standby's wait and CPU priority, and the
functions traced and instantiated before the restore (``Supervisor.warm_up``). Runs in the trainer.
"""
