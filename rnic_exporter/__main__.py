from rnic_exporter.cli import run

run()
