"""Scenarios run inside the lab VM by tests/kernel/driver.py: each defines `run(lab: Lab) -> dict`."""
