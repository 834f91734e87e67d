"""The ends of trainer processes, as the trainer sees them (runs in the trainer, before and after the program): its
own death made known to the watchdog at once (:mod:`.deathnotice`), and the earlier attempts' ends it waits for before
its program runs (:mod:`.predecessors`)."""
