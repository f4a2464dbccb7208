"""Every metric and every event, declared once: the exporter, dashboards and alert rules read names here."""
