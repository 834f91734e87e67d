"""A group program that claims to be the chief in every task: Supervisor(is_chief=True) everywhere.

Task 0 then waits, as MultiWorkerMirroredStrategy's constructor would for a peer that never comes.
"""

import sys
import time

import procsv

procsv.Supervisor(is_chief=True, checkpoint=None)  # task 1 must refuse this: two chiefs would both save
time.sleep(60)
sys.exit(0)
