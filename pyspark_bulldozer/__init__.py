"""Spark's name for Bulldozer's data source: Spark looks up top-level ``pyspark_*``
modules for a ``DefaultSource`` and registers it, so ``df.write.format("bulldozer")``
works wherever Bulldozer is installed, without ``register(spark)``."""

from bulldozer.load.engines.spark.datasource import BulldozerDataSource as DefaultSource

__all__ = ["DefaultSource"]
