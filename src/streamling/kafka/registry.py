"""Confluent-compatible schema registry access (Confluent, Apicurio ``/apis/ccompat/v7``, …)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from streamling.config.sections import KafkaConnection
from streamling.errors import StreamlingError


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int
    version: int
    schema: dict[str, Any]

    @property
    def text(self) -> str:
        return json.dumps(self.schema)


class Registry:
    """A thin, caching wrapper over confluent-kafka's SchemaRegistryClient with readable errors."""

    def __init__(self, conn: KafkaConnection, node: str, node_kind: str) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = conn.schema_registry_url
        self.node, self.node_kind = node, node_kind
        self._client = SchemaRegistryClient(conn.registry())
        self._by_id: dict[int, dict[str, Any]] = {}
        self._versions: dict[str, dict[int, RegisteredSchema]] = {}
        self._lock = threading.Lock()

    def _error(self, what: str, exc: BaseException, hint: str, retriable: bool = True) -> StreamlingError:
        return StreamlingError(f"{what} at schema registry {self.url} failed: {exc}", node=self.node,
                               node_kind=self.node_kind, retriable=retriable, hint=hint, code="schema_registry")

    def versions(self, subject: str) -> dict[int, RegisteredSchema]:
        """Every version registered under ``subject`` (``schema id → schema``), refreshed on call."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        with self._lock:
            known = self._versions.setdefault(subject, {})
            try:
                numbers = self._client.get_versions(subject)
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    raise StreamlingError(
                        f"subject '{subject}' has no schema in the registry at {self.url}", node=self.node,
                        node_kind=self.node_kind, code="subject_missing",
                        hint="produce to the topic with a Confluent Avro serializer first, or use data_format: json"
                    ) from exc
                raise self._error(f"listing versions of '{subject}'", exc, "check schema_registry_url") from exc
            except Exception as exc:  # noqa: BLE001 - connection problems come as several types
                raise self._error(f"listing versions of '{subject}'", exc,
                                  "check schema_registry_url and that the registry is running") from exc
            seen_versions = {s.version for s in known.values()}
            for number in numbers:
                if number in seen_versions:
                    continue
                registered = self._client.get_version(subject, number)
                schema = json.loads(registered.schema.schema_str or "null")
                schema_id = int(registered.schema_id or 0)
                known[schema_id] = RegisteredSchema(schema_id, number, schema)
                self._by_id[schema_id] = schema
            return dict(known)

    def latest(self, subject: str) -> RegisteredSchema:
        versions = self.versions(subject)
        return max(versions.values(), key=lambda s: s.version)

    def by_id(self, schema_id: int) -> dict[str, Any]:
        if schema_id not in self._by_id:
            try:
                self._by_id[schema_id] = json.loads(self._client.get_schema(schema_id).schema_str or "null")
            except Exception as exc:  # noqa: BLE001
                raise self._error(f"looking up schema id {schema_id}", exc, "the id is unknown to the registry",
                                  retriable=False) from exc
        return self._by_id[schema_id]

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        from confluent_kafka.schema_registry import Schema

        try:
            return int(self._client.register_schema(subject, Schema(json.dumps(schema), "AVRO")))
        except Exception as exc:  # noqa: BLE001
            raise self._error(f"registering a schema under '{subject}'", exc,
                              "check the subject's compatibility settings in the registry") from exc
