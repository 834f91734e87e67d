"""A job that spans hosts (``procsv launch --nnodes M``): the node agent on hosts 1..M-1, node 0's
link to them, the group members they run, and the CURVE keys that secure the link. Runs in the
watchdogs (node 0's master and every other host's agent).
"""
