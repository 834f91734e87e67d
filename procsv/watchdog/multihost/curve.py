"""The CURVE keys of a job that spans hosts, and the sockets they secure.

Runs in the watchdogs of a ``procsv launch --nnodes M`` job: node 0's (the master) creates the
keys; every other node's agent loads them. The scheme: at each launch the master generates a
fresh server key pair and a fresh client key pair (``zmq.curve_keypair``) and writes them to
``<logdir>/.procsv/curve/`` -- a directory of mode 0700 whose files are 0600, written atomically
(write, fsync, rename) -- with the job's id. The logdir is shared by the job's hosts (as
TensorFlow assumes for its checkpoints) and readable only by the job's user: a peer that cannot
read those files cannot complete the CURVE handshake, because the master's ZAP handler
(:class:`zmq.auth.thread.ThreadAuthenticator`) admits only the job's client public key. The
connection is encrypted and authenticated both ways (the agents pin the server's public key).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import zmq

from procsv.common.layout import Layout, atomic_write, read_json, write_json


@dataclass(frozen=True)
class JobKeys:
    """One job's keys (Z85 text) and its id."""

    job: str
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def keys_dir(layout: Layout) -> str:
    return os.path.join(layout.meta, "curve")


def create_job_keys(layout: Layout) -> JobKeys:
    """New keys for a new job (the master, at each launch), replacing any earlier job's."""
    folder = keys_dir(layout)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    keys = JobKeys(uuid.uuid4().hex[:12], server_public, server_secret, client_public, client_secret)
    # 0600 from the first byte (a chmod after the rename left each file readable for an fsync's time)
    for name in ("server_public", "server_secret", "client_public", "client_secret"):
        atomic_write(os.path.join(folder, name), getattr(keys, name).decode("ascii"), mode=0o600)
    write_json(os.path.join(folder, "job.json"), {"job": keys.job}, mode=0o600)  # last: the keys are complete
    return keys


def load_job_keys(layout: Layout) -> Optional[JobKeys]:
    """The current job's keys (an agent), or None if the master has not written them (or they are unreadable)."""
    folder = keys_dir(layout)
    record = read_json(os.path.join(folder, "job.json"))
    if not isinstance(record, dict) or not isinstance(record.get("job"), str):
        return None
    try:
        parts = {}
        for name in ("server_public", "server_secret", "client_public", "client_secret"):
            with open(os.path.join(folder, name), "rb") as fh:
                parts[name] = fh.read().strip()
    except OSError:
        return None
    return JobKeys(record["job"], **parts)


class _OnlyTheJob:
    """The ZAP credentials check: admit the job's client public key only."""

    def __init__(self, client_public: bytes) -> None:
        self._key = client_public  # Z85, as pyzmq's authenticator hands the client's key over

    def callback(self, domain: str, key: bytes) -> bool:
        return bool(key == self._key)


def serve(ctx: "zmq.Context[Any]", sock: "zmq.Socket[Any]", keys: JobKeys) -> Any:
    """Make ``sock`` (not yet bound) a CURVE server that admits only this job's agents; returns
    the authenticator thread, which the caller stops (``.stop()``) when it closes the socket."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_OnlyTheJob(keys.client_public))
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True
    return auth


def connect_as_agent(sock: "zmq.Socket[Any]", keys: JobKeys) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of this job's master."""
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public
