"""Kafka tests use the broker and registry fixtures of tests/integration/conftest.py."""
