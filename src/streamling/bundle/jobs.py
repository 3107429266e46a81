"""A bundle's jobs: their tasks' graph, parameters, schedule or trigger, notifications, and jobs run by jobs.

A job is checked as a whole once its tasks are built: task keys are unique, dependencies stay inside the job and
form no cycle, a ``run_job_task`` names a job of the bundle with parameters it declares and no job ends up
running itself, and parameters' dynamic value references can be filled in when a task starts. Development mode
prefixes, tags and pauses the job as the Databricks CLI does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from streamling.bundle import references
from streamling.bundle.model import Job, PauseStatus, Periodic, Schedule, Task
from streamling.bundle.schema import EVENTS
from streamling.bundle.tasks import TaskBuilder
from streamling.bundle.tree import as_dict, as_list
from streamling.util import did_you_mean


class JobBuilder(TaskBuilder):
    """Builds one job at a time; ``mode`` and ``user`` are the target's."""

    mode: Literal["development", "production"] | None
    user: str

    def job(self, key: str, body: Any) -> Job | None:
        if not isinstance(body, dict):
            return None  # reported by the schema check
        path, dev = f"resources.jobs.{key}", self.mode == "development"
        self.node = (key, "job")
        name = self.str_(body, "name", path) or key
        tags = self.strings(body, "tags", path)
        if dev:
            name, tags["dev"] = f"[dev {self.user}] {name}", self.user
        self.environments = self.job_environments(path, body.get("environments"))
        self.job_clusters = {str(as_dict(c).get("job_cluster_key")): as_dict(as_dict(c).get("new_cluster"))
                             for c in as_list(body.get("job_clusters")) if as_dict(c).get("job_cluster_key")}
        raw_tasks = body.get("tasks")
        if not raw_tasks:
            self.add(path if raw_tasks is None else f"{path}.tasks", "has no tasks",
                     hint="add tasks: [{task_key: main, notebook_task: {notebook_path: …}}]")
        tasks = [task for i, item in enumerate(as_list(raw_tasks))
                 if (task := self.task(key, f"{path}.tasks.{i}", item)) is not None]
        self.node = (key, "job")
        self.check_graph(key, path, tasks)
        parameters: dict[str, str] = {}
        for i, item in enumerate(as_list(body.get("parameters"))):
            where = f"{path}.parameters.{i}"
            pname = self.str_(as_dict(item), "name", where, required=True)
            default = self.str_(as_dict(item), "default", where, required=True)
            if pname is not None and pname in parameters:
                self.add(f"{where}.name", f"job parameter '{pname}' is declared twice", hint="remove one of them")
            elif pname is not None and default is not None:
                parameters[pname] = default
        for where, problem in references.job_problems(path, raw_tasks, body.get("parameters"), parameters, tasks):
            self.add(where, problem, code="bundle_unknown_reference",
                     hint="Databricks' dynamic value references: {{job.run_id}}, {{job.parameters.<name>}}, "
                          "{{task.name}}, {{job.start_time.iso_date}}, …")
        for hidden in self.iteration_jobs.values():  # an iteration reads its job's parameters
            if hidden.iteration_of is not None and hidden.iteration_of[0] == key:
                hidden.parameters = dict(parameters)
        schedule = None
        if isinstance(body.get("schedule"), dict):
            schedule = self.schedule(body["schedule"], f"{path}.schedule")
        trigger = as_dict(body.get("trigger"))
        for kind in ("file_arrival", "table_update", "table"):
            if kind in trigger:
                self.add(f"{path}.trigger.{kind}", f"trigger.{kind} is not supported here",
                         hint="use trigger.periodic, schedule or continuous")
        periodic = None
        if isinstance(trigger.get("periodic"), dict):
            periodic = self.periodic(trigger["periodic"], f"{path}.trigger", trigger)
        elif "trigger" in body and not any(k in trigger for k in ("file_arrival", "table_update", "table")):
            self.add(f"{path}.trigger", "trigger has no periodic",
                     hint="set trigger.periodic: {interval: 1, unit: HOURS}")
        continuous = None
        if body.get("continuous") is not None:
            continuous = self.pause(as_dict(body["continuous"]), f"{path}.continuous")
        given = [k for k in body if k in ("schedule", "trigger", "continuous") and body[k] is not None]
        if len(given) > 1:
            self.add(f"{path}.{given[1]}", f"has both {given[0]} and {given[1]}",
                     hint="a job is either continuous, scheduled or triggered: keep one")
        return Job(
            key=key, name=name, tasks=tasks, parameters=parameters, schedule=schedule, periodic=periodic,
            continuous=continuous, max_concurrent_runs=self.int_(body, "max_concurrent_runs", path, 4 if dev else 1, 1),
            timeout_seconds=self.int_(body, "timeout_seconds", path, 0, 0), tags=tags,
            webhook_notifications=self.notifications(body, "webhook_notifications", path),
            email_notifications=self.notifications(body, "email_notifications", path),
            source=self.ctx.source(path))

    def schedule(self, body: dict[str, Any], path: str) -> Schedule | None:
        cron = self.str_(body, "quartz_cron_expression", path)
        if cron is None:
            self.add(f"{path}.quartz_cron_expression", "schedule has no quartz_cron_expression",
                     hint="set e.g. quartz_cron_expression: '0 0 * * * ?' (seconds minutes hours day month weekday)")
        elif len(cron.split()) not in (6, 7):
            self.add(f"{path}.quartz_cron_expression",
                     f"quartz_cron_expression '{cron}' has {len(cron.split())} fields; Quartz expects 6 or 7",
                     hint="seconds minutes hours day-of-month month day-of-week [year], e.g. '0 0 * * * ?'")
            cron = None
        zone = self.str_(body, "timezone_id", path) or "UTC"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            self.add(f"{path}.timezone_id", f"unknown timezone_id '{zone}'",
                     hint="use an IANA name such as Europe/Paris")
        status = self.pause(body, path)
        return Schedule(cron, zone, status) if cron is not None else None

    def periodic(self, body: dict[str, Any], path: str, trigger: dict[str, Any]) -> Periodic | None:
        if "interval" not in body:
            self.add(f"{path}.periodic", "trigger.periodic has no interval", hint="set interval: 1 or more")
        interval = self.int_(body, "interval", f"{path}.periodic", 0, 1)
        unit = body.get("unit")
        if unit not in ("MINUTES", "HOURS", "DAYS", "WEEKS"):
            self.add(f"{path}.periodic.unit" if "unit" in body else f"{path}.periodic",
                     f"trigger.periodic.unit must be MINUTES, HOURS, DAYS or WEEKS (got {unit!r})")
        status = self.pause(trigger, path)
        return Periodic(interval, unit, status) if interval >= 1 and unit in ("MINUTES", "HOURS", "DAYS", "WEEKS") \
            else None

    def notifications(self, body: dict[str, Any], key: str, path: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        section = as_dict(body.get(key))
        for event in EVENTS:
            for i, item in enumerate(as_list(section.get(event))):
                where = f"{path}.{key}.{event}.{i}"
                if key == "email_notifications":
                    if isinstance(item, str) and "@" in item:
                        out.setdefault(event, []).append(item)
                    else:
                        self.add(where, f"{item!r} is not an email address")
                elif isinstance(item, dict) and "id" in item and "url" not in item:
                    self.add(f"{where}.id", "webhook destinations by id are not supported here",
                             hint="give the address instead: - url: https://…")
                elif isinstance(item, dict) and isinstance(item.get("url"), str) and set(item) == {"url"}:
                    out.setdefault(event, []).append(item["url"])
                else:
                    self.add(where, "a webhook entry must be {url: https://…}")
        return out

    def pause(self, obj: dict[str, Any], path: str) -> PauseStatus:
        """Unset means paused in development (as Databricks: a dev deploy never starts work by itself)."""
        value = obj.get("pause_status")
        if value is None:
            return "PAUSED" if self.mode == "development" else "UNPAUSED"
        if value not in ("PAUSED", "UNPAUSED"):
            self.add(f"{path}.pause_status", f"pause_status must be PAUSED or UNPAUSED (got {value!r})")
            return "PAUSED"
        return cast(PauseStatus, value)

    def check_run_jobs(self, jobs: Mapping[str, Job]) -> None:
        """Each run_job_task names a job of this bundle with the parameters it declares, and no job
        ends up running itself (``a -> b -> a``), which would never finish."""
        calls: dict[str, list[str]] = {}
        for key, job in jobs.items():
            for i, task in enumerate(job.tasks):
                if task.run_job is None:
                    continue
                where = f"resources.jobs.{key}.tasks.{i}.run_job_task"
                target = jobs.get(task.run_job)
                if target is None:
                    self.ctx.add(f"{where}.job_id", f"runs job '{task.run_job}', which this bundle "
                                 f"does not define{did_you_mean(task.run_job, list(jobs))}",
                                 hint="job_id: ${resources.jobs.<key>.id}", node=task.key, node_kind="task")
                    continue
                calls.setdefault(key, []).append(task.run_job)
                for name in task.job_parameters:
                    if name not in target.parameters:
                        self.ctx.add(f"{where}.job_parameters.{name}", f"job '{task.run_job}' declares no parameter "
                                     f"'{name}'{did_you_mean(name, list(target.parameters))}",
                                     hint=f"declare it in job '{task.run_job}' (parameters: [{{name: {name}, "
                                          "default: …}]) or drop it", node=task.key, node_kind="task")
        for start in calls:
            todo, seen = [(start, [start])], set()
            while todo:
                node, trail = todo.pop()
                for callee in calls.get(node, []):
                    if callee == start:
                        self.ctx.add(f"resources.jobs.{start}", "jobs run each other in a cycle: "
                                     f"{' -> '.join(trail + [start])}", hint="a run_job_task may not lead back to "
                                     "its own job", code="bundle_cycle")
                        todo = []
                        break
                    if callee not in seen:
                        seen.add(callee)
                        todo.append((callee, trail + [callee]))

    def check_graph(self, job: str, path: str, tasks: list[Task]) -> None:
        """Unique task keys, dependencies inside the job, and no cycles (reported as ``a -> b -> a``)."""
        first: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if task.key in first:
                self.add(f"{path}.tasks.{i}.task_key", f"task_key '{task.key}' is used twice",
                         hint=f"task keys are unique per job; the first is at {tasks[first[task.key]].source}")
            first.setdefault(task.key, i)
        for i, task in enumerate(tasks):
            for j, dep in enumerate(task.depends_on):
                if dep not in first:
                    others = [k for k in first if k != task.key]
                    self.ctx.add(f"{path}.tasks.{i}.depends_on.{j}.task_key",
                                 f"depends on '{dep}', which is not a task of job '{job}'{did_you_mean(dep, others)}",
                                 hint=f"tasks in this job: {', '.join(others) or 'none'}", node=task.key,
                                 node_kind="task")
        conditions = {t.key for t in tasks if t.kind == "condition"}
        for i, task in enumerate(tasks):
            for dep in task.outcomes:
                if dep in first and dep not in conditions:
                    self.add(f"{path}.tasks.{i}.depends_on", f"depends on the outcome of '{dep}', which is not a "
                             "condition task", hint="outcome only follows a condition_task; remove it")
        graph = {t.key: [d for d in t.depends_on if d in first] for t in tasks}
        state: dict[str, int] = {}

        def visit(node: str, stack: list[str]) -> None:
            state[node] = 1
            stack.append(node)
            for dep in graph.get(node, []):
                if state.get(dep) == 1:  # back edge: the stack from dep to here is a cycle
                    cycle = stack[stack.index(dep):]
                    where = f"{path}.tasks.{first[node]}.depends_on"
                    if len(cycle) == 1:
                        self.add(where, f"task '{node}' depends on itself", hint="remove that depends_on entry")
                    else:
                        self.add(where, f"tasks depend on each other in a cycle: {' -> '.join([*cycle, dep])}",
                                 hint="remove one of these depends_on entries")
                elif dep not in state:
                    visit(dep, stack)
            stack.pop()
            state[node] = 2

        for task in tasks:
            if task.key not in state:
                visit(task.key, [])
