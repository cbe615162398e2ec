"""A TCP forwarder on 127.0.0.1 that a test can cut and restore: storage outages on demand.

`Forwarder(port)` listens on a free loopback port and relays every connection to
``127.0.0.1:port`` (e.g. moto's S3 server). Two kinds of outage:

- `cut()`: the endpoint is down. Connections open through it are reset and new ones are
  refused (the listening socket is closed).
- `stall()`: the route is dropped. Open connections go silent (what is sent is swallowed,
  nothing comes back, nobody resets them) and stay so for good, as behind a middlebox that
  lost their state; new connections are accepted and go silent too.

`restore()` relays new connections again (listening on the same port after a cut).
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
        self._silent: set[socket.socket] = set()  # connections that swallow everything
        self._stalled = False
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
            self._stalled = False
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

    def stall(self) -> None:
        """Silence every open connection for good, and new ones until `restore`."""
        with self._lock:
            self._stalled = True
            self._silent |= self._connections

    def close(self) -> None:
        self.cut()
        with self._lock:
            silent, self._silent = self._silent, set()
        for connection in silent:
            _reset(connection)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            with self._lock:
                stalled = self._stalled
                if stalled:
                    self._connections.add(client)
                    self._silent.add(client)
            if stalled:  # accepted, then nothing: read and swallow what it sends
                threading.Thread(target=self._pipe, args=(client, client), daemon=True).start()
                continue
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
                if source in self._silent or sink in self._silent:
                    continue  # a stalled connection swallows what it gets
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if source not in self._silent and sink not in self._silent:  # silent: no FIN either
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
    """Close with a TCP reset (SO_LINGER 0), as a server that went down looks to the peer.
    Shutting the reading side first wakes a thread blocked reading it: closing alone would
    leave the socket open (and unreset) as long as that read lasts."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        connection.close()
