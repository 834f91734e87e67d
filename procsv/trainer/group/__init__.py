"""What a ``--nproc N`` group's member sets up of TensorFlow's group machinery before the program runs
(:mod:`.heartbeat_bound`: the coordination service's heartbeat bound). Runs in the trainer.
"""
