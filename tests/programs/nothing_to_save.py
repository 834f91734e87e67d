"""A train module that gives its Supervisor nothing to save (no ``checkpoint=``, no ``saver=``).

Issue 40: it must be refused at construction, one line naming ``checkpoint=`` (a ``UsageError``),
never run on saving nothing. ``--opt-out`` passes ``checkpoint=None``: the documented opt-out, which
runs (with a warning) and saves nothing.
"""

import sys

import tensorflow as tf

import procsv

w = tf.Variable(0.0)
sv = procsv.Supervisor(checkpoint=None) if "--opt-out" in sys.argv else procsv.Supervisor()
with sv.managed_session() as sess:
    for _ in range(5):
        sess.run(lambda: w.assign_add(1.0))
print(f"ran {sv.step} steps", flush=True)
