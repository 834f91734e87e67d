"""A trainer that says where its root logger's handlers write, then logs a line and trains 3 steps:
a zygote seed's fork carries its launching interpreter's logging (tests/test_zygote_seed.py)."""

import logging
import os

import tensorflow as tf

import procsv

weights = tf.Variable(tf.zeros([1]))
sv = procsv.Supervisor(checkpoint={"weights": weights})
with sv.managed_session() as sess:
    for handler in logging.getLogger().handlers:
        stream = getattr(handler, "stream", None)
        if stream is not None and not stream.closed:
            print("logs_to_root: a handler writes to", os.readlink(f"/proc/self/fd/{stream.fileno()}"), flush=True)
    logging.warning("logs_to_root: a trainer's line")
    while not sv.should_stop() and sv.step < 3:
        sess.run(lambda: weights.assign_add(tf.ones([1])))
