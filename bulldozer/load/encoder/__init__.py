"""Rows → protobuf key/value bytes, shared by every load engine: the encoder
(``encode``) and the row layouts it builds (``layouts``), written by the compiled kernels
(``bulldozer._kernels``)."""
