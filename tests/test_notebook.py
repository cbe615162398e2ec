"""Jupyter: HTML views, figures, the tidy trials table, the live view in a real kernel, and
examples/quickstart.ipynb run top to bottom with nbclient."""

from __future__ import annotations

import os

import pytest

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.checkpoints import CheckpointStore
from dagtune.notebook import plot_curves, plot_tree, result_html, study_html
from dagtune.plan import build_stage_tree
from dagtune.sim import SimulatedExecutor, SyntheticTrainer
from dagtune.summary import trials_frame

SPACE = dt.Grid(
    {
        "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [4], 0.1)],
        "momentum": [0.9, dt.Steps([0.9, 0.5], [3])],
    }
)
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture
def finished(tmp_path):
    study = dt.Study(
        SyntheticTrainer,
        name="nb",
        storage=str(tmp_path),
        executor=SimulatedExecutor(2, store=CheckpointStore(str(tmp_path))),
    )
    result = study.run(GridSearch(SPACE, metric="val_loss", mode="min", steps=8))
    yield study, result
    study.close()


def test_html_views_show_summary_best_trial_and_tree(finished):
    study, result = finished
    page = study_html(study)
    assert "Study &#x27;nb&#x27;" in page and "32 trial · 21 unique · 21 executed" in page
    assert "best val_loss" in page and "<svg" in page and "0.9→0.5@3" in page
    assert "4 completed" in result_html(result)


def test_stage_tree_html_lists_stages_under_their_parents(tmp_path):
    study = dt.Study(
        SyntheticTrainer,
        name="t",
        storage=str(tmp_path),
        executor=SimulatedExecutor(1, store=CheckpointStore(str(tmp_path))),
    )
    for config in SPACE:
        study.submit(config, 8)
    tree = build_stage_tree(study.plan)
    html = tree._repr_html_()
    assert f"{len(tree.stages)} stages, {tree.total_steps} steps to train" in html
    assert html.count("<tr>") == len(tree.stages) + 1
    assert "empty stage tree" in type(tree)([])._repr_html_()


def test_trials_frame_has_one_column_per_hyper_parameter(finished):
    _, result = finished
    frame = trials_frame(result._trials)
    assert frame.index.name == "trial_id" and list(frame.columns[:2]) == ["status", "steps"]
    assert {"lr/schedule", "momentum/schedule", "val_loss"} <= set(frame.columns)
    assert sorted(frame["momentum/schedule"]) == ["0.9", "0.9", "0.9→0.5@3", "0.9→0.5@3"]
    assert sorted(frame["momentum/first"]) == [0.9] * 4
    assert sorted(frame["momentum/last"]) == [0.5, 0.5, 0.9, 0.9]


def test_figures_hold_the_curves_and_the_tree(finished):
    _, result = finished
    curves = plot_curves(result)
    lines = next(r for r in curves.renderers if "xs" in r.data_source.data)
    assert len(lines.data_source.data["xs"]) == 4 and curves.yaxis[0].axis_label == "val_loss"
    tree = plot_tree(result)
    bars = next(r for r in tree.renderers if "state" in r.data_source.data)
    assert max(bars.data_source.data["trials"]) == 4 and set(bars.data_source.data["state"]) == {"done"}


def _execute(notebook, cwd: str, updates: list | None = None):
    """Run `notebook` in a real kernel; returns the code cells' outputs. `updates` receives
    the HTML of every ``update_display_data`` message (in-place updates of a display,
    which the saved notebook only shows the last of)."""
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")

    class Recording(nbclient.NotebookClient):
        def process_message(self, msg, cell, cell_index):
            if updates is not None and msg["msg_type"] == "update_display_data":
                updates.append(msg["content"]["data"].get("text/html", ""))
            return super().process_message(msg, cell, cell_index)

    Recording(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    return [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]


@pytest.mark.slow
def test_study_run_updates_its_live_view_in_a_real_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "import time\n"
            "import dagtune as dt\n"
            "from distributed import Client, LocalCluster\n"
            "from dagtune.algos import GridSearch\n"
            "from dagtune.sim import SyntheticTrainer\n"
            "class Sleepy(SyntheticTrainer):\n"
            "    def train(self):\n"
            "        time.sleep(0.1)\n"
            "        return super().train()\n"
            "cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol='tcp://',\n"
            "                       host='127.0.0.1', dashboard_address='127.0.0.1:0')\n"
            "client = Client(cluster)"
        ),
        nbformat.v4.new_code_cell(  # no watch here: Study.run shows the live view itself
            "space = dt.Grid({'lr': [0.1, dt.MultiStep(0.1, [4], 0.1)]})\n"
            f"with dt.Study(Sleepy, name='live', storage={str(tmp_path / 'runs')!r}, client=client) as study:\n"
            "    result = study.run(GridSearch(space, metric='val_loss', mode='min', steps=30))"
        ),
        nbformat.v4.new_code_cell("client.close()\ncluster.close()"),
    ]
    updates: list[str] = []
    outputs = _execute(notebook, str(tmp_path), updates)
    assert not [o for o in outputs if o.output_type == "error"]
    (view,) = [o for o in notebook.cells[1].outputs if o.output_type == "display_data"]
    final = view["data"]["text/html"]
    assert "dagtune live: 2/2 trials finished" in final and "2 completed" in final and "<svg" in final
    assert "dashboard</a>" in final  # the link to the dagtune page
    during = [html for html in updates if "dagtune live: " in html and "2/2 trials finished" not in html]
    assert len(during) >= 3  # it moved while the study ran, not only at its end
    trained = [int(html.split(" steps trained")[0].rsplit(" ", 1)[-1]) for html in during]
    assert trained == sorted(trained) and trained[-1] > trained[0]


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's storage: a temporary directory
    notebook = nbformat.read(os.path.join(EXAMPLES, "quickstart.ipynb"), as_version=4)
    outputs = _execute(notebook, EXAMPLES)
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "12 trials, merge rate 1.62" in text and "'executed_steps': 148" in text
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("0.5→0.9@5" in table for table in tables)  # the tidy trials table
    shown = [o for o in outputs if "application/vnd.bokehjs_exec.v0+json" in o.get("data", {})]
    assert len(shown) == 2  # the curves and the tree
