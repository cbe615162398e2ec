"""Search plan records: node ids, checkpoint info, and the plan's events (``node``,
``checkpoint``, ``drop_checkpoint``, ``metrics``) checked one by one (`parse_plan_event`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dagtune.config import Config, config_dumps, config_to_json
from dagtune.records._checks import MAX_STEPS, NODE_ID, Fields, RecordError, is_int, shorten, shown

__all__ = ["CheckpointInfo", "PlanEvent", "node_id", "parse_plan_event"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def node_id(
    parent: str | None, start: int, config: Config, salt: str = "", as_json: dict | None = None
) -> str:
    """The id of a search plan node: a hash of its content (parent, branch step, config and,
    for a trial-based run's private path, its salt), so that every writer agrees on it.
    `as_json` is the config's `config_to_json`, when the caller made it already."""
    text = f"{parent or ''}|{start}|{config_dumps(config, as_json)}|{salt}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)  # one per checkpoint in the plan: no __dict__
class CheckpointInfo:
    """A committed checkpoint: its size and content hash, for verification and GC."""

    nbytes: int = 0
    sha256: str = ""

    def __reduce__(self) -> tuple[type[CheckpointInfo], tuple[int, str]]:
        """Made back by its constructor (a study's resume state holds one per checkpoint:
        the frozen data class's own pickling looks its fields up for each)."""
        return CheckpointInfo, (self.nbytes, self.sha256)


@dataclass(frozen=True)
class PlanEvent:
    """A search plan event, checked: `event` holds exactly the fields the plan reads, and
    `config` is a node event's config, parsed."""

    event: dict[str, Any]
    config: Config | None = None

    @property
    def needs(self) -> str | None:
        """The node the plan must know before this event applies: a node's parent, the node
        of any other event."""
        return self.event["parent"] if self.event["e"] == "node" else self.event["node"]


def parse_plan_event(record: Mapping[str, Any]) -> PlanEvent:
    """One line of a search plan journal, checked (`RecordError` says what is wrong)."""
    kind = record.get("e")
    parse = _PLAN_EVENTS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise RecordError(f"unknown search plan event 'e' = {shown(kind)}")
    return parse(Fields(record, f"{kind} event"))


def _node_event(fields: Fields) -> PlanEvent:
    identifier = fields.node("id")
    parent = fields.get(
        "parent", lambda v: v is None or (isinstance(v, str) and NODE_ID.match(v)), "a node id or null"
    )
    if parent is None:
        start = fields.get("start", lambda v: is_int(v) and v == 0, "0 (a root starts at step 0)")
    else:
        start = fields.integer("start", 1, MAX_STEPS - 1, "a step")
    config = fields.config()
    private = fields.get("private", lambda v: isinstance(v, bool), "true or false", optional=True)
    salt = fields.text("salt", optional=True)
    if private and (parent is not None or not salt):
        raise RecordError("a private node event must be a root with a non-empty 'salt'")
    if not private and salt is not None:
        raise RecordError("node event field 'salt' belongs to private nodes only")
    expected = node_id(parent, start, config, salt or "")
    if identifier != expected:
        raise RecordError(
            f"node id {identifier} does not match its content ({shorten(config_dumps(config), 80)})"
        )
    event = {
        "e": "node",
        "id": identifier,
        "parent": parent,
        "start": start,
        "config": config_to_json(config),
    }
    if private:
        event["private"], event["salt"] = True, salt
    return PlanEvent(event, config)


def _checkpoint_event(fields: Fields) -> PlanEvent:
    return PlanEvent(
        {
            "e": "checkpoint",
            "node": fields.node("node"),
            "step": fields.step(),
            "nbytes": fields.integer("nbytes", 0, 2**63 - 1, "a size in bytes"),
            "sha256": fields.text("sha256", pattern=_SHA256),
        }
    )


def _drop_event(fields: Fields) -> PlanEvent:
    return PlanEvent({"e": "drop_checkpoint", "node": fields.node("node"), "step": fields.step()})


def _metrics_event(fields: Fields) -> PlanEvent:
    return PlanEvent(
        {"e": "metrics", "node": fields.node("node"), "step": fields.step(), "metrics": fields.metrics()}
    )


_PLAN_EVENTS: dict[str, Callable[[Fields], PlanEvent]] = {
    "node": _node_event,
    "checkpoint": _checkpoint_event,
    "drop_checkpoint": _drop_event,
    "metrics": _metrics_event,
}
