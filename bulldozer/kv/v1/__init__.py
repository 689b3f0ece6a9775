"""Generated from proto/bulldozer/kv/v1/kv.proto by scripts/gen_kv_proto.py."""
