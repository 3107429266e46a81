"""Options of the built-in transforms: ``sql``, ``script``, ``wasm``, ``handler`` and ``dynamic_table``."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from streamling.spec.options import FromNodeOptions, HttpNodeOptions, check_column_types, text_map
from streamling.spec.types import check_type_names


class SqlTransformOptions(FromNodeOptions):
    type: Literal["sql"] = "sql"
    sql: str


class ScriptTransformOptions(FromNodeOptions):
    """JavaScript/TypeScript run per batch in a WebAssembly sandbox; ``schema`` coerces the output."""

    type: Literal["script"] = "script"
    language: Literal["javascript", "typescript"] = "javascript"
    script: str
    schema_: dict[str, str] | None = Field(default=None, alias="schema")

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: Any) -> Any:
        aliases = {"js": "javascript", "ts": "typescript"}
        text = str(value).strip().lower()
        return aliases.get(text, text)

    _types = field_validator("schema_")(classmethod(lambda cls, value: check_column_types(value)))


class WasmTransformOptions(FromNodeOptions):
    """A user's Extism plugin, called once per Arrow batch (README: "WASM plugin transform")."""

    type: Literal["wasm"] = "wasm"
    module: str = Field(description="path of the .wasm file, relative to the working directory")
    function: str = "process"
    config: dict[str, str] = Field(default_factory=dict, description="the Extism plugin config")
    input_format: Literal["json", "arrow"] = "json"
    schema_: dict[str, str] | None = Field(default=None, alias="schema")
    timeout_ms: int = Field(default=10_000, ge=1, description="per plugin call")
    memory_max_pages: int | None = Field(default=None, ge=1, description="64 KiB pages")

    _config = field_validator("config", mode="before")(classmethod(lambda cls, value: text_map(value)))

    _types = field_validator("schema_")(classmethod(lambda cls, value: check_column_types(value)))


class HandlerTransformOptions(HttpNodeOptions):
    """Rows go to an HTTP endpoint; its JSON response becomes the output rows."""

    type: Literal["handler"] = "handler"
    schema_override: dict[str, str | None] | None = None

    @field_validator("schema_override")
    @classmethod
    def _override_types(cls, value: dict[str, str | None] | None) -> dict[str, str | None] | None:
        check_type_names(value, allow_drop=True)
        return value


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DYNAMIC_TABLE_BACKENDS = {"postgres": "Postgres", "inmemory": "InMemory"}


class DynamicTableTransformOptions(FromNodeOptions):
    """A lookup set that SQL transforms query with ``dynamic_table_check('<node>', value)``.

    With ``sql`` (a projection and filter over one input) the set is filled from each epoch's
    batch of that input before the transforms that query it run. Without ``sql`` it is managed
    outside the pipeline (rows inserted or deleted directly in Postgres).
    """

    #: common node keys Streamling's dynamic_table does not take; rejected as unknown keys.
    not_accepted: ClassVar[frozenset[str]] = frozenset({"primary_key", "parallelism", "batch_size",
                                                        "batch_flush_interval", "expectations"})

    produces_rows: ClassVar[bool] = False

    type: Literal["dynamic_table"] = "dynamic_table"
    backend_type: Literal["Postgres", "InMemory"]
    backend_entity_name: str = Field(description="the table (Postgres) or set name holding the values")
    sql: str | None = Field(default=None, description="projection/filter over one input; fills the table")
    schema_: str | None = Field(default=None, alias="schema",
                                description="Postgres schema; default dynamic_table_backend.postgres.dt_schema_name")
    column: str = "value"
    time_column: str = "updated_at"
    cache: bool | None = Field(default=None, description="Postgres: keep the set in memory and refresh it "
                                                         "incrementally; default dynamic_table_backend.postgres."
                                                         "cache_enabled")
    cache_refresh_debounce_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="wrap")
    @classmethod
    def _own_keys_only(cls, data: Any, handler: Any) -> Any:
        """Report ``primary_key`` & co. exactly like any other unknown key, alongside other problems."""
        if not isinstance(data, dict) or not (cls.not_accepted & set(data)):
            return handler(data)
        errors: list[InitErrorDetails] = [InitErrorDetails(type="extra_forbidden", loc=(k,), input=data[k])
                                          for k in data if k in cls.not_accepted]
        try:
            handler({k: v for k, v in data.items() if k not in cls.not_accepted})
        except ValidationError as exc:
            for err in exc.errors():
                detail = InitErrorDetails(type=err["type"], loc=err["loc"], input=err.get("input"))
                if "ctx" in err:
                    detail["ctx"] = err["ctx"]
                errors.append(detail)
        raise ValidationError.from_exception_data(cls.__name__, errors)

    @field_validator("backend_type", mode="before")
    @classmethod
    def _backend(cls, value: Any) -> Any:
        """Streamling ignores case and punctuation: ``postgres``, ``in-memory``, ``InMemory`` …"""
        norm = re.sub(r"[^a-z]", "", str(value).lower())
        if norm not in DYNAMIC_TABLE_BACKENDS:
            raise ValueError(f"must be Postgres or InMemory (got {value!r})")
        return DYNAMIC_TABLE_BACKENDS[norm]

    @field_validator("sql")
    @classmethod
    def _sql_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty; leave 'sql' out for a table filled outside the pipeline")
        return value

    @model_validator(mode="after")
    def _postgres_identifiers(self) -> DynamicTableTransformOptions:
        if self.from_ and self.sql is None:
            raise ValueError("'from' is only used with 'sql' (the input whose rows fill the table)")
        if self.from_ and len(self.from_) > 1:
            raise ValueError(f"a dynamic table is filled from one input; 'from' lists {len(self.from_)}")
        if self.backend_type == "Postgres":
            for key, value in (("backend_entity_name", self.backend_entity_name), ("schema", self.schema_),
                               ("column", self.column), ("time_column", self.time_column)):
                if value is not None and not IDENTIFIER.match(value):
                    raise ValueError(f"{key} {value!r} is not a plain identifier; use letters, digits and _ "
                                     "(not starting with a digit)")
        return self
