"""Bundles: ``bundle.yml`` (Databricks Asset Bundle conventions) deploys notebooks as supervised jobs.

- ``model``    what a bundle resolves to for one target: the ``Bundle`` and its jobs, tasks, pipelines (no Spark).
- ``loading``  bundle.yml (+ ``include``, targets) → that ``Bundle``, every problem reported at once; the
               keys it knows are ``schema``'s, ``${…}`` is ``variables``', and ``builder``, ``jobs``,
               ``tasks`` and ``pipelines`` check each value as they build the resources.
- ``references`` the ``{{job.parameters.x}}``… a task reads when it starts: checked at load, filled per run.
- ``compile``  a notebook (.ipynb or Databricks source .py) → the pipeline its ``%%streamling`` cells build.
- ``deploy``   validate everything, then write an immutable, versioned deployment under the target root.
- ``store``    runs, attempts, requests and notifications in one durable SQLite file.
- ``runner``   the job runner: one supervisor process per target root (schedules, retries, redeploys).
- ``driver``   one task attempt: runs a compiled pipeline on the target's Spark master.
"""
