"""What the front-ends (Keras ``fit``, ``procsv.train``'s sessions and hooks) may ask of a Supervisor.

Runs in the trainer process. The front-ends drive a :class:`procsv.Supervisor` from outside its
``managed_session`` block; they go through :class:`procsv.trainer.frontend.port.FrontEnd`, the
Supervisor's ``front_end``, and never read its collaborators.
"""
