"""The audit of a trainer's snapshot intervals (issue 71): the verdict (pure) and its executor (the watchdog's)."""
