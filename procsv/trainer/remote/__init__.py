"""A group member of another host than node 0 (``PROCSV_GROUP_REMOTE``): what its trainer runs
beside the step path to stay connected to node 0's checkpoint service (:mod:`.peer_follow`).
Runs in the trainer.
"""
