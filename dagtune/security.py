"""TLS for studies on Dask, by the path users know: `tls_from_files` (the client side of a
cluster secured with certificate files) and `embedded_security` (what `Study(security=...)`
makes of its argument for the embedded cluster).

They live in `dagtune.execution`, which says who may connect to a study's cluster and why;
this module hands them on under the names scripts already use (docs/architecture.md,
"Execution: one package, the paths users know").
"""

from dagtune.execution import embedded_security, protocol_of, tls_from_files

__all__ = ["embedded_security", "protocol_of", "tls_from_files"]
