"""The watched clock: monotonic time without the time a process was stopped (SIGSTOP, then SIGCONT).

Imported by every process whose timers must not count a suspension of the job (Slurm's ``scontrol
suspend``/``resume``): the watchdog and the node agents (every timer of theirs), the trainer (every
deadline of its step boundary: a snapshot's result, a summary batch's acknowledgement, the saves'
and summaries' intervals). :mod:`.unwatched` is the arithmetic (pure), :mod:`.watched` the clock that
installs the SIGCONT handler and reads the raw clock.
"""
