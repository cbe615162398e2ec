"""Markdown tables for RESULTS.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> str:
    """`columns` are (key, heading) pairs."""
    lines = ["| " + " | ".join(heading for _, heading in columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(key, "")) for key, _ in columns) + " |")
    return "\n".join(lines)
