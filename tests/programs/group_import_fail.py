"""A group program whose worker 1 fails at import (a module it needs is missing); task 0 is fine.

The chief then waits in MultiWorkerMirroredStrategy's constructor for a worker that never comes:
only the watchdog's group rule can end it (tests/test_group.py).
"""

import sys

import procsv.cluster

if procsv.cluster.rank() == 1:
    import procsv_no_such_module  # noqa: F401  # the worker's start-up failure

from procsv.examples.digits import main

sys.exit(main())
