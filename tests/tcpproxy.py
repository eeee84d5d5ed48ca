"""A TCP proxy in front of a server, for the tests: it counts the bytes
clients send through it and can cut every connection part-way through a
request, then refuse new ones until healed: a network that fails under a
long upload, which a fault inside the client library cannot stand in for."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class CuttingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.sent = 0  # bytes from clients passed on to the server
        self.received = 0  # bytes from the server passed on to clients
        self.down = False
        self._cut_at: tuple[bool, int] | None = None  # (of what clients send?, at)
        self._stay_down = True
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, count: int, *, sent: bool = True, stay_down: bool = True) -> None:
        """Pass ``count`` more bytes from clients (``sent``) or to them, then
        cut every connection and refuse new ones until :meth:`heal` (or,
        without ``stay_down``, take new ones at once)."""
        with self._lock:
            self._cut_at = (sent, (self.sent if sent else self.received) + count)
            self._stay_down = stay_down

    def heal(self) -> None:
        with self._lock:
            self.down = False
            self._cut_at = None

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            self._drop_all()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self.down:
                    _reset(client)
                    continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, sent: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if self.down:
                        return
                    passed = self.sent if sent else self.received
                    cut = self._cut_at
                    if cut is not None and cut[0] == sent and passed + len(data) >= cut[1]:
                        data = data[: cut[1] - passed]
                    if sent:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                    cutting = cut is not None and cut[0] == sent and passed + len(data) >= cut[1]
                    if cutting:
                        self._cut_at = None
                sink.sendall(data)  # not under the lock: the other way may be waiting
                if cutting:
                    with self._lock:
                        self.down = self._stay_down
                        self._drop_all()
                    return
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def _drop_all(self) -> None:
        for sock in self._open:
            _reset(sock)
        self._open.clear()


def _reset(sock: socket.socket) -> None:
    """Close with a reset, as a dropped route or a dead middlebox does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)  # wakes a thread blocked reading it
    with contextlib.suppress(OSError):
        sock.close()
