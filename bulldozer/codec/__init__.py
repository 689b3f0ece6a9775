"""Pure bytes, no job schema: protobuf wire pieces (``protowire``), a stored protobuf
``FileDescriptorSet`` read into a private pool (``descriptors``), Arrow buffers for the
compiled kernels (``buffers``), the order-independent digest and its hash (``digest``)."""
