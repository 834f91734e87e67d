"""procsv's inter-process communication: the message schema, its codec and the ZeroMQ transport."""
