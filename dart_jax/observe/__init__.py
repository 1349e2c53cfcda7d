"""Watching a run: its records read incrementally, utilization, the live view and the plots."""
