"""Pluggable-module memory decoders: SFF-8636 (QSFP+/QSFP28) and CMIS (QSFP-DD/OSFP).

Pure functions over bytes; reading the bytes is `rnic_exporter.sources.ethtool_netlink`.
"""
