"""Configuration: embedded defaults < config file < ``STREAMLING__…`` environment variables."""

from streamling.config.sections import PostgresConnection, PostgresSinkSettings
from streamling.config.settings import (
    Settings,
    deep_merge,
    env_variables,
    load_settings,
    mask_secrets,
    normalize_sink_name,
)

__all__ = [
    "PostgresConnection",
    "PostgresSinkSettings",
    "Settings",
    "deep_merge",
    "env_variables",
    "load_settings",
    "mask_secrets",
    "normalize_sink_name",
]
