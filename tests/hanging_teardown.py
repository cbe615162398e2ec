"""A nanny preload whose teardown never ends (``distributed.nanny.preload``): a nanny that
can't close, as a plugin hung on a lost resource leaves it, for the closing tests."""

from __future__ import annotations

import asyncio
from typing import Any


async def dask_teardown(nanny: Any) -> None:
    await asyncio.sleep(3600)
