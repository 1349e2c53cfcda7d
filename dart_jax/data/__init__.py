"""The data manager: the run's store, task scheduling, ingestion and curated batches.

A CPU process with no JAX import (tests/test_imports.py holds it to that). Modules:
config (its config), curation (DART's rules, pure functions), store/tables/blobs (SQLite
WAL + content-addressed screenshots), ingest (group commit), scheduler, batches, pool
(import/export), stats, integrity, service (the process and its `run`).
"""
