"""Imports of TensorFlow with Python's cyclic garbage collector off.

Imported by the processes that import TensorFlow on procsv's own behalf, before any program of the
user's runs in them: the zygote (:mod:`procsv.zygote.__main__`: TensorFlow and procsv's trainer; the
user's ``--preload`` modules after, with the collector as they leave it) and the checkpoint service
(:mod:`procsv.services.checkpoint.preload`, its loader thread). A user's program imports TensorFlow
itself, with its own collector.

``import tensorflow`` makes about 270,000 objects that outlive it, and the collector, run on every
700 new ones, visits the surviving ones again and again: 0.41 s of the import's 2.3 s of CPU here, to
find almost no garbage (0 to 1,400 objects: ``gc.collect()`` after an import with the collector off).
Off for the import, it visits none of them; the import is about a fifth cheaper.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Python's cyclic garbage collector off while the block runs, then as it was (process-wide: other
    threads' cycles wait for it too, and are collected after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
