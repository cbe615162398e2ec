"""A TCP forwarder on 127.0.0.1 that a test can cut and restore: storage outages on demand.

`Forwarder(port)` listens on a free loopback port and relays every connection to
``127.0.0.1:port`` (e.g. moto's S3 server). `cut()` makes the endpoint unreachable as a
network outage does: connections open through it are reset and new ones are refused (the
listening socket is closed); `restore()` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

__all__ = ["Forwarder"]


class Forwarder:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.accepted = 0
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again, on the same port once it has one) and relay new connections."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self.port = listener.getsockname()[1]
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="forwarder-accept", daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for connection in connections:
            _reset(connection)

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _reset(client)
                    _reset(upstream)
                    return
                self._connections.update((client, upstream))
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            with self._lock:
                self._connections.discard(source)
            with contextlib.suppress(OSError):
                source.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _reset(connection: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped network path looks to the peer."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        connection.close()
