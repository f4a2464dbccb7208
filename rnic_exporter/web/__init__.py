"""HTTP front of the exporter: landing page, telemetry path, health, TLS and basic auth."""
