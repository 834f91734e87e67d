"""Code that runs in the trainer process: its bootstrap, its sockets, its state snapshots."""
