"""``procsv.keras.BackupAndRestore``: Keras ``model.fit`` under procsv, resumed exactly. Runs in the
trainer process, inside ``model.fit``.
"""
