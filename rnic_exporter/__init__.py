"""rnic-exporter: watch RDMA NICs and say, before the training job dies, that one is sick."""

__version__ = "0.1.0"
__all__ = ["__version__"]
