"""Kafka plumbing shared by the Kafka source and sink: registry access and Avro schemas."""
