"""The trainer's graph-mode pieces: what lets a TF1 ``tf.compat.v1`` graph program run under
``procsv.Supervisor`` (its state as the checkpoint agent handles it, its session, its defaults).
Runs in the trainer process, in graph mode only.
"""
