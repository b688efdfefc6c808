"""No network for uploaded code in the sandbox's children.

A Python-level guard, not a security boundary (the sandbox's process limits are that): it turns
the accidental download (pretrained weights, a dataset, a pip call) into an immediate, clear
error instead of a hang until the timeout.
"""
from __future__ import annotations

import socket

MESSAGE = "network access is disabled while an uploaded module runs"


def _refuse(*args, **kwargs):
    raise OSError(MESSAGE)


def block_network() -> None:
    """Make every new connection and name lookup in this process fail at once."""
    socket.socket.connect = _refuse
    socket.socket.connect_ex = _refuse
    socket.getaddrinfo = _refuse
    socket.create_connection = _refuse
