"""procsv's service processes: one sub-package per OS process (checkpoint, summary)."""
