"""The watchdog process (``procsv launch``): starts, watches and restarts the run's processes."""
