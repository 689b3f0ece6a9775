"""The ``bulldozer`` command line: thin over the library."""
