"""No network for uploaded code in the sandbox's children.

A Python-level guard, not a security boundary (the sandbox's process limits are that): it turns
the accidental download (pretrained weights, a dataset, a pip call) into an immediate, clear
error instead of a hang until the timeout.
"""
from __future__ import annotations

import socket

MESSAGE = "network access is disabled while an uploaded module runs"


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex


def _refuse(*args, **kwargs):
    raise OSError(MESSAGE)


def _local_only(original):
    """connect() that still serves Unix sockets (multiprocessing, compile workers)."""
    def connect(self, address):
        if self.family == getattr(socket, "AF_UNIX", None):
            return original(self, address)
        raise OSError(MESSAGE)
    return connect


def block_network() -> None:
    """Make every new network connection and name lookup in this process fail at once."""
    socket.socket.connect = _local_only(_connect)
    socket.socket.connect_ex = _local_only(_connect_ex)
    socket.getaddrinfo = _refuse
    socket.create_connection = _refuse
