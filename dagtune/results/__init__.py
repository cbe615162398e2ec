"""Study results as a zarr group: one row per trial, learning curves as ``[trial, step]``.

The coordinator is the only writer (`ResultsWriter`); anyone can read the group with
zarr, xarray or `open_results` (pandas). The group lives at
``{storage}/studies/{name}/results.zarr`` and holds::

    trial_id  int64 [trial]          status  str [trial]      steps  int64 [trial] (reached)
    config    str [trial] (canonical JSON of the config)      error  str [trial] ("" if none)
    step      int64 [step] = 0, 1, 2, ...
    final/<metric>  float64 [trial]          curve/<metric>  float64 [trial, step] (NaN: not evaluated)
    hyper/<name>/constant  bool [trial]  whether the trial's sequence is constant (true if it lacks it)
    hyper/<name>/first     str [trial]   its value at step 0, as JSON ("null" if it lacks it)
    hyper/<name>/schedule  str [trial]   its short text (`dagtune.frames.readable`; "" if it lacks it)
    hyper/<name>/last      str [trial]   its value at the last step reached, as JSON ("null": none)

A step is one call of ``Trainer.train()`` counted from 0, and ``curve/<metric>[i, s]`` is the
metric of trial ``i`` evaluated right after step ``s`` (after ``s + 1`` steps of training), as
in every curve dagtune shows (`dagtune.frames`). Groups written before that convention
(format ``dagtune-results/1``) numbered the same columns 1, 2, ...: they read the same, and a
study that resumes one rewrites its ``step`` coordinate. The ``hyper/`` cells are what the
trials frame shows of each hyper-parameter, worked out by the writer (the last value again
as the trial's steps change) so that reading a frame parses no config; groups written
before them (format ``dagtune-results/2``) read the same by parsing each row's config, and
a study that resumes one writes them.

with attributes ``format``, ``study``, ``identity``, ``metrics`` (metric name -> array
name, since a metric name may hold characters an array name can't) and ``hyperparameters``
(hyper-parameter name -> array name). There is one row per trial, in trial id order
(``trial_id`` says which) unless a trial came late (restored after a later one was
written: appended), and readers sort by ``trial_id``.

A write costs the rows that changed, wherever they are in the table (format
``dagtune-results/5``): the arrays above are the base, and every write appends one entry to
the change log, a text array::

    log  str [entry]  the rows and curve points of one write, packed as JSON (`._log`)

an entry holding all the cells of the trials new to the group and the changing cells
(status, steps, error, final metrics, hyper-parameters' last values) of every trial the
write stored, and the curves' new points. The attributes ``rows`` (base rows), ``steps``
(curve columns), ``based`` (``metrics`` and ``hyperparameters``: the array names the base
holds) and ``log`` (committed entries) say how much of each array counts (the ``log``
array has room for more entries than are committed: it doubles when full and never
shrinks), and are written last, in one store write: that commits the write. Readers take the base's rows, then the
trials new in the log in the order they came, and apply the log's cells in order (the last
entry of a trial, or of a curve cell, wins). Once the log reaches a quarter of the table,
and when the study closes, the writer applies it to the base and empties it, so after a
study the base arrays are the whole table again. Groups of format ``dagtune-results/4`` (a
change log of one array per column) and ``dagtune-results/3`` (no log: the arrays whole)
read the same; a study that resumes one writes it anew in this format.

Its modules: `._format` (the arrays, their cells, the zarr calls zarr 3 and zarr 2.18 make
differently), `._log` (the change log's entries), `._writer` (`ResultsWriter`, the
coordinator's) and `._reader` (`open_results`, `StudyResults`).
"""

from dagtune.results._format import FORMAT, results_url
from dagtune.results._reader import StudyResults, open_results
from dagtune.results._writer import ResultsWriter

__all__ = ["FORMAT", "ResultsWriter", "StudyResults", "open_results", "results_url"]
