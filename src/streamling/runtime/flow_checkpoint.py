"""The checkpoint of one flow and its record: which sources it was written for, and which nodes.

A Spark checkpoint holds the sources' positions, so resuming it with other source settings could
skip or repeat data: the record (``flow.json``, next to the checkpoint) keeps a fingerprint of the
sources, refused when it changed, and of the transforms and sinks, said once when they changed (a
node added to a resumed checkpoint sees only later rows). Apart from ``flow`` because it is the
flow's bookkeeping across runs, not its epochs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from streamling import storage
from streamling.config import Settings
from streamling.errors import StreamlingError
from streamling.runtime import checkpoints
from streamling.runtime.nodes import Source
from streamling.runtime.planner import Flow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the flow's log lines name the flow module, whichever part of it speaks
log = logging.getLogger("streamling.runtime.flow")
#: Keys that change how a node runs, not which rows it reads or writes: a checkpoint stays valid.
NOT_FINGERPRINTED = {"telemetry", "description", "parallelism", "batch_size", "batch_flush_interval"}


class FlowCheckpoint:
    """Where one flow keeps its Spark checkpoints (one per phase of its sources) and its record."""

    def __init__(self, settings: Settings, flow: Flow, sources: list[Source], spark: SparkSession,
                 state: Any | None) -> None:
        self.settings = settings
        self.flow = flow
        self.sources = sources
        #: the flow's folder: a local path or a URI of shared storage (``streamling.storage``); with
        #: the ``InMemory`` backend, a folder of this process under it (``checkpoints.place``)
        self.root = storage.join(storage.resolve(settings.state_dir), settings.application_id, flow.name)
        self.store = storage.storage_for(self.root, spark)
        self.placement = checkpoints.place(self.root, state, self.store)
        self.root = self.placement.root
        self.checkpoint_dir = storage.join(self.root, "checkpoint")
        self.meta_path = storage.join(self.root, "flow.json")
        self._announced = False
        self.sink_token = ""
        self._meta: dict[str, Any] = {}
        #: the resumed checkpoint's record names other transforms or sinks: warned once, recorded once
        #: the query starts (``adopt``)
        self.adopt_topology = False

    def enter_phase(self, phase: str) -> None:
        """Point at the checkpoint of the sources' current phase (hybrid: backfill, live)."""
        self.checkpoint_dir = storage.join(self.root, f"checkpoint-{phase}" if phase else "checkpoint")

    def adopt(self) -> None:
        """Record the topology warned about, once the query started: later restarts resume quietly."""
        if self.adopt_topology:
            self.write_meta()
            self.adopt_topology = False

    def fingerprint(self) -> dict[str, Any]:
        return {"sources": {s.name: {"type": s.ctx.spec.type,
                                     "options": s.options.model_dump(mode="json", exclude=NOT_FINGERPRINTED)}
                            for s in self.sources}}

    def topology(self) -> dict[str, dict[str, dict[str, str]]]:
        """The flow's transforms and sinks: type and a digest of options and inputs (no secrets stored)."""
        def entry(spec: Any) -> dict[str, str]:
            options = spec.options.model_dump(mode="json", exclude=NOT_FINGERPRINTED)
            body = json.dumps({"options": options, "from": list(spec.upstream)}, sort_keys=True, default=str)
            return {"type": spec.type, "fingerprint": hashlib.sha256(body.encode()).hexdigest()[:16]}

        return {"transforms": {t.name: entry(t) for t in self.flow.transforms},
                "sinks": {s.name: entry(s) for s in self.flow.sinks}}

    def check(self) -> None:
        """A checkpoint belongs to one set of sources; refuse a silently mismatched resume.

        Transforms and sinks may change between runs (a redeploy with a new SQL is normal), but a
        node added to a resumed checkpoint only sees rows after its last committed epoch; that is
        said once, loudly, and the new topology is recorded when the query starts.
        """
        fingerprint = self.fingerprint()
        topology = self.topology()
        # One record per flow: the phases of a hybrid source share its fingerprint and sink token.
        store = self.store
        if store.exists(self.meta_path) and any(store.exists(storage.join(self.root, d, "offsets"))
                                                for d in store.list_names(self.root) if d.startswith("checkpoint")):
            meta = json.loads(store.read_text(self.meta_path))
            if meta.get("fingerprint") != fingerprint:
                raise StreamlingError(
                    f"flow '{self.flow.name}': the checkpoint at {self.checkpoint_dir} was written for different "
                    "source settings, so resuming from it could skip or repeat data",
                    code="checkpoint_incompatible",
                    hint=self._start_over_hint())
            self.sink_token = str(meta["sink_token"])
            self._meta = {**meta, "topology": topology}
            self._announce(resumed=True)
            recorded = meta.get("topology")
            if recorded != topology:
                self.adopt_topology = True
                self._warn_topology(recorded, topology)
            return
        store.mkdirs(self.root)
        self.sink_token = f"{self.settings.application_id}:{self.flow.name}:{uuid.uuid4().hex[:12]}"
        self._meta = {"fingerprint": fingerprint, "sink_token": self.sink_token, "topology": topology}
        self.write_meta()
        self._announce(resumed=False)

    def _start_over_hint(self) -> str:
        """How to start the flow over. Sources that keep their position in a durable state backend
        resume from it in a new checkpoint too, so deleting the folder is not enough for them."""
        keeping = [s.name for s in self.sources if s.new_application_note] if self.placement.durable else []
        if keeping:
            return (f"to start this flow over, run it under a new application_id: source(s) {keeping} keep their "
                    f"positions in the {self.placement.backend} state backend and would resume from them")
        return f"to start this flow over, delete {self.root} (or change application_id)"

    def _announce(self, resumed: bool) -> None:
        """One line per run and flow: whether it resumes a checkpoint or reads its sources from their start."""
        if self._announced:
            return
        self._announced = True
        flow, backend = self.flow.name, self.placement.backend
        if resumed:
            committed, _ = self.last_committed()
            after = f"after epoch {committed}" if committed is not None else "(no epoch committed yet)"
            kept = ("positions last as long as this process" if not self.placement.durable
                    else "it keeps the sources' positions between runs")
            log.info("flow '%s': resuming the checkpoint at %s %s (state_backend %s: %s)", flow,
                     self.checkpoint_dir, after, backend, kept)
        elif self.placement.durable:
            log.info("flow '%s': starting fresh, the sources read from their configured start (no checkpoint at %s "
                     "yet; state_backend %s resumes it on the next run)", flow, self.checkpoint_dir, backend)
        else:
            log.info("flow '%s': starting fresh, the sources read from their configured start (state_backend %s "
                     "keeps no position between runs; set state_backend.backend_type to Sqlite or Postgres to "
                     "resume); checkpoint of this process: %s", flow, backend, self.checkpoint_dir)

    def write_meta(self) -> None:
        self.store.write_text(self.meta_path, json.dumps(self._meta, indent=2))

    def _warn_topology(self, recorded: Any, topology: dict[str, dict[str, dict[str, str]]]) -> None:
        """One warning per flow naming the nodes that do not see the rows the checkpoint already consumed."""
        flow = self.flow.name
        where = f"the checkpoint of application_id '{self.settings.application_id}' ({self.checkpoint_dir})"
        committed, offsets = self.last_committed()
        after = f"after epoch {committed}" + (f" (the checkpoint's last committed offsets: {offsets})"
                                              if offsets else "")
        notes = sorted({s.new_application_note for s in self.sources if s.new_application_note})
        backfill = "To backfill, run under a new application_id: it reads the sources from their start" + "".join(
            f"; {note}" for note in notes) + "."
        if not isinstance(recorded, dict):
            if committed is None:
                return  # nothing was committed: every node sees every row
            log.warning("flow '%s': %s does not record the transforms and sinks it was written with (an older "
                        "streamling wrote it), so a sink or transform added since then only sees rows %s; rows "
                        "consumed before are not replayed to it. %s", flow, where, after, backfill)
            return
        changes: list[str] = []
        fresh = False
        for kind, label in (("transforms", "transform"), ("sinks", "sink")):
            old: dict[str, Any] = recorded.get(kind) or {}
            new = topology[kind]
            added = [f"{label} '{n}' ({new[n]['type']})" for n in new if n not in old]
            removed = [f"{label} '{n}' ({old[n].get('type', '?')})" for n in old if n not in new]
            changed = [f"{label} '{n}' ({new[n]['type']})" for n in new if n in old and old[n] != new[n]]
            fresh = fresh or bool(added or changed)
            changes += [f"new {c}" for c in added] + [f"removed {c}" for c in removed]
            changes += [f"changed {c}" for c in changed]
        if committed is None:
            log.info("flow '%s': %s has no committed epoch yet, so every node sees every row (%s)", flow, where,
                     ", ".join(changes))
            return
        consequence = (f"New and changed nodes only see rows {after}; rows consumed before are not replayed to them. "
                       f"{backfill}" if fresh else f"The remaining nodes continue {after}.")
        log.warning("flow '%s': resuming %s with a different set of nodes: %s. %s", flow, where, ", ".join(changes),
                    consequence)

    def last_committed(self) -> tuple[int | None, str]:
        """The checkpoint's last committed epoch and its end offsets per source, as Spark wrote them."""
        try:
            commits = [int(n) for n in self.store.list_names(storage.join(self.checkpoint_dir, "commits"))
                       if n.isdigit()]
        except (OSError, StreamlingError):
            return None, ""
        if not commits:
            return None, ""
        epoch = max(commits)
        try:
            lines = self.store.read_text(storage.join(self.checkpoint_dir, "offsets", str(epoch))).splitlines()[2:]
        except (OSError, StreamlingError):
            return epoch, ""
        names = [s.name for s in self.sources]
        parts = [f"{n} {o}" for n, o in zip(names, lines, strict=True)] if len(lines) == len(names) else lines
        text = "; ".join(parts)
        return epoch, text if len(text) <= 300 else text[:297] + "..."
