"""Pure bytes, no schema: protobuf wire pieces (``protowire``), Arrow buffers for the
compiled kernels (``buffers``), the order-independent digest and its hash (``digest``)."""
