"""Bundles: ``bundle.yml`` (Databricks Asset Bundle conventions) deploys notebooks as supervised jobs.

- ``model``    bundle.yml (+ ``include``) → a resolved, validated ``Bundle`` for one target (no Spark).
- ``compile``  a notebook (.ipynb or Databricks source .py) → the pipeline its ``%%streamling`` cells build.
- ``deploy``   validate everything, then write an immutable, versioned deployment under the target root.
- ``store``    runs, attempts, requests and notifications in one durable SQLite file.
- ``runner``   the job runner: one supervisor process per target root (schedules, retries, redeploys).
- ``driver``   one task attempt: runs a compiled pipeline on the target's Spark master.
"""
