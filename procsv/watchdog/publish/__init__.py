"""What the world sees of a run: the status file, lifecycle events, the live line, Prometheus
metrics, procsv's TensorBoard scalars, the recovery report and the terminal writer. Runs in the
watchdog. Nothing here decides: it renders the watchdog's view.
"""
