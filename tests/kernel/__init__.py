"""The kernel lab: the real Linux RDMA stack (rdma_rxe) under QEMU; see tests/kernel/README.md."""
