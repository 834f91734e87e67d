"""procsv.examples.digits, but first it starts helpers of its own, as a data loader does.

    --helpers FILE   before training, start three helpers and write their pids to FILE.<attempt>
                     (atomically, one line "<escaped> <orphaned> <daemon>"):
                     escaped   a sleeper in a session of its own (``setsid``): it escapes this
                               process's group and parent-death signal, and outlives this process
                     orphaned  a child that exits once this process is gone (its parent changes)
                     daemon    a grandchild whose parent (a shell) exits at once; it exits after 1 s

Every other argument is digits'. Each helper's parent, once its own is gone, is the nearest child
subreaper: the watchdog, or on another host the node agent.
"""

import argparse
import os
import subprocess
import sys

from procsv.examples.digits import main

p = argparse.ArgumentParser()
p.add_argument("--helpers", default=None, metavar="FILE")
args, rest = p.parse_known_args()

if args.helpers:
    escaped = subprocess.Popen(["sleep", "3600"], start_new_session=True).pid
    orphaned = subprocess.Popen([sys.executable, "-c", "import os, time\nparent = os.getppid()\n"
                                 "while os.getppid() == parent:\n    time.sleep(0.05)"]).pid
    shell = subprocess.run(["sh", "-c", "sleep 1 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                           check=True)
    daemon = int(shell.stdout.split()[0])
    path = f"{args.helpers}.{os.environ.get('PROCSV_ATTEMPT', '1')}"
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{escaped} {orphaned} {daemon}\n")
    os.replace(path + ".tmp", path)

sys.exit(main(rest))
