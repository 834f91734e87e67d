"""The watchdog's decision function and the data it reads and returns. Runs in the watchdog.

Pure: no clock (``now`` is passed in), no process, no file, no socket. :func:`decide.decide` takes
the observed :class:`state.RunView`, a time and the limits and returns :mod:`actions`; the executor
(:mod:`procsv.watchdog.executor`) performs them. A test (tests/test_rooms.py) walks every import of
this folder and allows only the standard library's pure modules, procsv's error, exit-code and
message-base types, and this folder itself.
"""
