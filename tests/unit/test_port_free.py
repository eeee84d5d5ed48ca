"""``port_free``: a port is free when a server could listen on it, and
connections of an earlier server, lingering in TIME_WAIT, do not stop one
(a kept cluster started right after another stopped)."""

from __future__ import annotations

import socket

from cli.cluster import free_port, port_free


def test_a_listening_port_is_taken_and_one_left_in_time_wait_is_free() -> None:
    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    try:
        assert not port_free(port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end lingers in TIME_WAIT
        client.close()
    finally:
        listener.close()
    assert port_free(port)
