"""``procsv.keras``: Keras ``model.fit`` under procsv.

What a training program imports (it runs in the trainer process): ``BackupAndRestore``, a drop-in
for ``keras.callbacks.BackupAndRestore`` that checkpoints through procsv's services and resumes
``fit`` at the next batch of the interrupted epoch. The code lives in
:mod:`procsv.trainer.keras.fit`; this module only re-exports it.
"""

from __future__ import annotations

from procsv.trainer.keras.fit import BackupAndRestore

__all__ = ["BackupAndRestore"]
