"""Who may connect to a study's Dask cluster: TLS with temporary credentials for the
embedded cluster, certificate files for any other.

A Dask scheduler runs whatever a connected client asks (``Client.run``, ``run_on_scheduler``,
any task) and holds what the study sent it (task specs, worker plugins, metadata). Loopback
keeps other machines out, not other users of this one; so the embedded cluster a study
starts speaks TLS with a key and self-signed certificate made for it alone
(``Security.temporary()``, as ``LocalCluster(security=True)`` does): the scheduler, its
workers and the study's client each prove they hold that key (mutual TLS), and nothing
else gets a connection. The key exists only in the memory of the study's process and of the
worker processes it starts (Python's ``ssl`` reads it from a file in a private temporary
directory for an instant while building each TLS context). Dask's dashboard stays plain
HTTP on 127.0.0.1, for reading: task keys and states, logs, call stacks, the dagtune page.

An external cluster (`dask scheduler` / `dask worker`) is secured the way Dask does it: the
same ``--tls-ca-file``/``--tls-cert``/``--tls-key`` for each process, or the Dask config
``distributed.comm.tls.*``; `tls_from_files` builds the client side of that for
``dagtune run --scheduler``.
"""

from __future__ import annotations

import os
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = ["embedded_security", "protocol_of", "tls_from_files"]


def embedded_security(security: bool | Security | None) -> Security:
    """The `distributed.security.Security` of an embedded cluster from `Study(security=...)`:
    ``True`` (or None, the default) makes temporary TLS credentials for this cluster alone,
    ``False`` none (plain TCP: any process of this machine can connect), and a `Security`
    is used as it is (it must hold a certificate and key for the scheduler, the workers and
    the client, e.g. `tls_from_files`)."""
    from distributed.security import Security

    if security is None or security is True:
        try:
            return Security.temporary()
        except ImportError as error:  # `cryptography` makes the key
            raise ImportError(
                "the embedded cluster's TLS credentials need the `cryptography` package "
                "(pip install cryptography), or pass security=False to run it without TLS"
            ) from error
    if security is False:
        return Security(require_encryption=False)
    if isinstance(security, Security):
        needed = {
            "a CA": security.tls_ca_file,
            "a scheduler certificate": security.tls_scheduler_cert,
            "a worker certificate": security.tls_worker_cert,
            "a client certificate": security.tls_client_cert,
        }
        missing = [what for what, value in needed.items() if not value]
        if missing:
            raise ValueError(
                "security: the embedded cluster's Security needs a CA and a certificate for the "
                f"scheduler, the workers and the client; it lacks {', '.join(missing)}"
            )
        return security
    raise ValueError(f"security must be True, False or a distributed.security.Security, got {security!r}")


def protocol_of(security: Security) -> str:
    """The Dask protocol its listeners use: ``tls://`` when `security` requires encryption."""
    return "tls://" if security.require_encryption else "tcp://"


def tls_from_files(ca_file: str, cert: str, key: str | None = None) -> Security:
    """A `Security` that uses one CA file, certificate and key for every role (scheduler,
    worker, client), as ``dask scheduler``/``dask worker --tls-ca-file --tls-cert
    --tls-key`` give each process its own; `key` may be None when the certificate file
    holds the key too. Encryption is required. Raises ValueError naming a missing or
    unusable file."""
    from distributed.security import Security

    for option, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{option} {path!r}: no such file")
    roles = {}
    for role in ("scheduler", "worker", "client"):
        roles[f"tls_{role}_cert"] = cert
        if key is not None:
            roles[f"tls_{role}_key"] = key
    security = Security(require_encryption=True, tls_ca_file=ca_file, **roles)
    try:  # reads the files as a connection would: fail here rather than at the first connection
        security.get_connection_args("client")
    except (ssl.SSLError, OSError) as error:
        raise ValueError(
            f"--tls-ca-file {ca_file!r}, --tls-cert {cert!r}, --tls-key {key!r}: not a usable PEM CA, "
            f"certificate and key ({error})"
        ) from None
    return security
