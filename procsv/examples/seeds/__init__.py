"""The code examples of the seeds (TensorFlow's ``Supervisor`` and ``MonitoredSession`` pages), ported to
TF2 one file each, a few lines away from the original.

Each runs in the trainer process: ``procsv launch procsv.examples.seeds.NAME --logdir DIR -- --steps N``
(or ``python -m procsv.examples.seeds.NAME --logdir DIR``). The port is the one issue #11 asks
for: ``tf.compat.v1.train.X`` / ``tf.train.X`` becomes ``procsv.train.X``, the train op becomes a
step function that returns the step's values, and ``sess.run(train_op)`` becomes
``sess.run(step_fn)``. Every example trains the same two-variable model (:mod:`.model`, the seeds'
"...add operations to the graph...") and also ends at ``--steps``, where the seeds loop until stopped.

* :mod:`.basic`: "Use for a single program" (``while not sv.should_stop(): sess.run(train_op)``);
* :mod:`.loop`: "Launching additional services" (``sv.loop(60, print_loss, (sess,))``);
* :mod:`.manual_summaries`: "Launching fewer services" (``summary_op=None``, a summary every 100 steps);
* :mod:`.retry`: ``managed_session``'s "retry the training loop in case of preemption";
* :mod:`.monitored_session`: ``MonitoredSession`` with a ``CheckpointSaverHook`` and a ``SummarySaverHook``;
* :mod:`.monitored_training`: ``MonitoredTrainingSession`` (the session the seeds recommend instead);
* :mod:`.run_step_fn`: ``MonitoredSession.run_step_fn`` with a ``StepContext``.
"""
