"""Helpers shared by tests that drive real processes (Prometheus, Alertmanager, the exporter)."""
