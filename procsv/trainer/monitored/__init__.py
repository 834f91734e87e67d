"""``procsv.train``'s MonitoredSession, Scaffold, session creators and hooks, around procsv's
Supervisor. Runs in the trainer process, in its main thread.
"""
