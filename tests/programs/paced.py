"""procsv.examples.digits (or ``--example procsv.examples.elastic_digits``), whose ``--step-delay`` ends
once the file ``--fast-after FILE`` exists.

A test whose run must last until an event (a host taken back, a host joined) paces its steps with
``--step-delay`` until the event, then creates FILE: the steps left run at once. The same steps,
batches and weights as the example's own (its delay is only a sleep after each step, and only that
sleep is skipped); the run is as long as before where it matters and no longer than that after.

Every other argument is the example's.
"""

import argparse
import importlib
import os
import sys
import time
import types

p = argparse.ArgumentParser()
p.add_argument("--fast-after", required=True, metavar="FILE")
p.add_argument("--example", default="procsv.examples.digits")
args, rest = p.parse_known_args()

example = importlib.import_module(args.example)


def sleep(secs: float) -> None:
    if not os.path.exists(args.fast_after):
        time.sleep(secs)


example.time = types.SimpleNamespace(**{**vars(time), "sleep": sleep})  # type: ignore[attr-defined]
sys.exit(example.main(rest))
