"""Bundles: ``bundle.yml`` (Databricks Asset Bundle conventions) deploys notebooks as supervised jobs.

Loading (no Spark):
- ``model``    what a bundle resolves to for one target: the ``Bundle`` and its jobs, tasks, pipelines.
- ``loading``  bundle.yml (+ ``include``, targets) → that ``Bundle``, every problem reported at once; the
               keys it knows are ``schema``'s, ``${…}`` is ``variables``', and ``builder``, ``jobs``,
               ``tasks`` and ``pipelines`` check each value as they build the resources; ``tree``,
               ``values``, ``cron`` and ``python_resources`` (``databricks-bundles`` resources) serve them.
- ``references`` the ``{{job.parameters.x}}``… a task reads when it starts: checked at load, filled per run.
- ``compile``  a notebook → the pipeline its ``%%streamling`` cells build (``notebook_reader`` reads the
               cells of .ipynb and Databricks source files, and finds ``%run`` targets).

Deploying:
- ``deploy``   validate everything, then write an immutable, versioned deployment under the target root;
               ``task_build`` is one task's part of it, ``environments`` the per-deployment Python
               environments, ``workspace`` the target root on local or shared storage.

Running:
- ``store``    runs, attempts, requests and notifications (``store_backends``: SQLite, or Postgres so
               that runners on several hosts share them).
- ``runner``   the job runner: one supervisor process per target root (``runner_start``), which owns
               ``lease`` (one supervisor at a time), ``triggers``, ``control_flow`` (condition, run_job,
               for-each), ``swaps`` (redeploys into running drivers), ``reaper`` (ended attempts),
               ``warm_drivers`` (standbys and the pool) and ``notifications``; ``attempts`` is its view
               of one driver process.
- ``driver``   one task attempt: runs a compiled pipeline on the target's Spark master
               (``task_definition``, ``notebook_job`` and ``sql_statements`` for whole notebooks,
               ``pipeline_task`` for declarative pipelines, ``redeploys``/``handover`` for hot swaps,
               ``fence`` for one writer per checkpoint, ``standby`` for a warm driver's wait).
- ``cli``      ``streamling bundle …`` (``cli_context``, ``cli_reports``).
"""
