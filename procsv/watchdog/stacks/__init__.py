"""The stacks of a run's trainer processes (issue 69): :mod:`.capture` reads them (and the cheap looks
of the stuck rule), :mod:`.artifact` is the watchdog's capture before a hang's kill and its file."""
