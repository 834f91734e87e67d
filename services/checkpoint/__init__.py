"""The checkpoint service process: persists trainer snapshots as TF-native checkpoints."""
