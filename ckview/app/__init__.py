"""The application model: what the explorer, ``ckview export`` and the read-only verbs show.

Qt-free and torch-free (import-linter contract in pyproject.toml), so the CLI and tests use it
headless:

- ``run``: the typed ``Run`` read from a trace by one reader (``load_trace``), with the numbers
  every consumer needs derived once (timeline, peak, step time, device scope, OOM);
- ``planning``: the checkpoint plan being built over a run (``PlanSession``) and its projection
  (``PlanOutcome``);
- ``report``: what a report shows (plan curves, their names and notes) and the curves as CSV;
- ``envelope``: peak-preserving downsampling of curves for drawing;
- ``style``: the colours and themes (plain data; ``ckview.gui.themes`` turns them into Qt).
"""
