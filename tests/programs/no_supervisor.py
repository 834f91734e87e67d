"""A training module that does its work and exits 0 without ever creating a procsv.Supervisor."""

print("no_supervisor: training without procsv", flush=True)
