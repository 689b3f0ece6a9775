"""Rows → protobuf key/value bytes, shared by every load engine: the encoder
(``encode``), the row layouts it builds (``layouts``) and the fused per-layout kernels
(``kernels``)."""
