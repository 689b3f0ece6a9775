"""Loading: the shared row encoder, the engines (local, Spark) and verification."""
