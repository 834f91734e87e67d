"""A trainer whose steps run TensorFlow's thread pools: a parallel tf.data map and a tf.function's
matmul (tests/test_zygote_seed.py: forked from a process that ran an op, such a step never ends).

    [STEPS]  total steps (default 20)
"""

import sys

import tensorflow as tf

import procsv

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
weights = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(checkpoint={"weights": weights})
batches = iter(tf.data.Dataset.range(10**6).map(lambda x: tf.cast(x, tf.float32) * 2.0, num_parallel_calls=4)
               .batch(64).prefetch(2))


@tf.function
def product(a):
    return tf.reduce_sum(tf.matmul(a, a))


def step():
    next(batches)
    product(tf.random.normal((400, 400)))
    weights.assign_add(tf.ones([4]))


with sv.managed_session() as sess:
    while not sv.should_stop() and sv.step < steps:
        sess.run(step)
print(f"parallel_ops: done at step {sv.step}", flush=True)
