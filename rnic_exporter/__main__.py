from rnic_exporter.cli import main

main()
