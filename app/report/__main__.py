"""``python -m app.report SWEEP_DIR [--x KEY] [--series KEYS] [--facet KEYS] [--metric COLUMN] [--target ACC]``:
the tables and plots of a sweep (app/report/__init__.py)."""

from app.report import main

main()
