"""The Python snippets of docs/*.md, as a user pastes them.

Most are sketches (``...`` where the user's data goes), so every one is parsed and every
study one starts must be under ``if __name__ == "__main__":`` (pasted into a script, a study
outside it is refused with `UnguardedMainError`: the embedded cluster's workers import the
script again). The pieces a user copies as they are run here: the muP trainer's `setup`
with only the values that changed, as dagtune hands them, and the surrogate study's script
up to its guard. (The surrogate study itself trains for about 45 s on 2 cores, as
`examples/surrogate.py` does: `tests/test_surrogate*.py` run that.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from test_readme import GUARD, study_calls_outside_the_guard

DOCS = Path(__file__).resolve().parent.parent / "docs"


def blocks(name: str) -> list[str]:
    """The ```python blocks of docs/`name`."""
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.DOTALL)


def block_with(name: str, text: str) -> str:
    """The one ```python block of docs/`name` that contains `text`."""
    found = [block for block in blocks(name) if text in block]
    assert len(found) == 1, f"{len(found)} blocks of docs/{name} contain {text!r}"
    return found[0]


def before_the_guard(block: str) -> str:
    return block[: block.index(GUARD)] if GUARD in block else block


#: the user's docs (DESIGN.md is the design's notes: its python blocks are pseudo-code)
USER_DOCS = sorted(p.name for p in DOCS.glob("*.md") if p.name != "DESIGN.md")


def test_the_user_docs_are_these():
    assert USER_DOCS == ["architecture.md", "fusion.md", "surrogate.md"]


@pytest.mark.parametrize("name", USER_DOCS)
def test_every_snippet_parses_and_starts_its_studies_under_the_guard(name):
    for block in blocks(name):
        ast.parse(block)
        assert study_calls_outside_the_guard(block) == [], f"docs/{name}:\n{block}"


def test_the_mup_trainers_setup_takes_only_the_values_that_changed():
    """docs/surrogate.md's `Scaled.setup`: a value that did not change is not in `hp`."""
    namespace: dict = {"__name__": "docs_surrogate"}
    exec(
        compile(before_the_guard(block_with("surrogate.md", "class Scaled(")), "surrogate.md", "exec"),
        namespace,
    )

    class Complete(namespace["Scaled"]):  # what the snippet leaves to the user (`...`)
        def train(self) -> dict:
            return {}

        def evaluate(self) -> dict:
            return {}

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    trainer = Complete(scale=8)
    trainer.setup({"lr": 0.1, "momentum": 0.5})  # a start: every value
    trainer.setup({"lr": 0.01})  # before a step where only the lr changes
    groups = trainer.optimizer.param_groups
    assert {group["momentum"] for group in groups} == {0.5}
    assert sorted({group["lr"] / group["lr_mult"] for group in groups}) == pytest.approx([0.01])


def test_the_surrogate_study_script_defines_its_grid_before_the_guard():
    block = block_with("surrogate.md", "dt.SurrogateStudy(")
    assert GUARD in block
    namespace: dict = {"__name__": "docs_surrogate_study"}
    exec(compile(before_the_guard(block), "surrogate.md", "exec"), namespace)
    assert len(namespace["space"]) == 21  # 7 learning rates x 3 momenta, as the text says
