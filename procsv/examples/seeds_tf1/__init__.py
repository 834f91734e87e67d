"""The code examples of the seeds (TensorFlow's ``Supervisor`` and ``MonitoredSession`` pages) as TF1
graph programs (``tf.compat.v1``), one file each, that differ from the seed page only in their
import lines.

Each runs in the trainer process: ``procsv launch procsv.examples.seeds_tf1.NAME --logdir DIR --
--steps N`` (or ``python -m procsv.examples.seeds_tf1.NAME --logdir DIR``). The port is the one
issue 40 asks for: ``tf.compat.v1.train.Supervisor`` becomes ``procsv.Supervisor`` and the
MonitoredSession family and its hooks ``procsv.train.*``; swapping those imports back gives the
same program under TensorFlow's own classes (``tests/test_seeds_tf1.py`` generates that twin and
runs both). Everything else is the minimum that makes a seed a program: eager execution off, the
graph of :mod:`.model` (``tf.compat.v1.get_variable`` and ``tf.matmul``: ``tf.compat.v1.layers``
does not exist with Keras 3) as the seeds' "...add operations to the graph...", flags for
``FLAGS``, a checkpoint interval, and an end at ``--steps`` where the seeds loop until stopped.

* :mod:`.basic`: "Use for a single program" (``while not sv.should_stop(): sess.run(my_train_op)``);
* :mod:`.loop`: "Launching additional services" (``sv.loop(60, print_loss, (sess,))``);
* :mod:`.manual_summaries`: "Launching fewer services" (``summary_op=None``, a summary every 100 steps);
* :mod:`.retry`: ``managed_session``'s "retry the training loop in case of preemption";
* :mod:`.monitored_session`: ``MonitoredSession`` with a ``CheckpointSaverHook`` and a ``SummarySaverHook``;
* :mod:`.run_step_fn`: ``MonitoredSession.run_step_fn`` with a ``StepContext``;
* :mod:`.monitored_training`: ``MonitoredTrainingSession`` (the session the seeds recommend instead);
* :mod:`.singular_monitored`: ``SingularMonitoredSession`` (TensorFlow's docstring example);
* :mod:`.replicas`: "Use for multiple replicas", under ``procsv launch --ps N --workers M`` (it needs
  a cluster, so it has no plain twin; ``tests/test_ps_replicas.py`` runs it).
"""
