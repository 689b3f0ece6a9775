"""A spec's ``data_movement.filter`` as a Spark Column, for the Spark engine's read by key.

A job spec is untrusted input, and Spark SQL is not a filter language: ``reflect`` and
``java_method`` call static Java methods in the driver and executors, so a filter handed to
``DataFrame.where`` as text could read the process's environment (``System.getenv``) and
leak it through which rows it lets through, or stop the JVM. The filter is therefore what
it is everywhere else: pyiceberg's row-filter grammar, parsed and bound to the table's
schema as the local engine's scan does (comparisons, ``IN``, ``IS NULL``, ``IS NAN``,
``STARTS WITH``, ``AND`` / ``OR`` / ``NOT`` over columns and literals), then built here as
Column objects, literal values passed as values and never parsed by Spark.

Each predicate keeps the value Arrow gives it in pyiceberg's own scan (``expression_to_pyarrow``),
where Spark's would differ, so both engines load the same rows: a null is not ``IN`` a list
(false, not null); ``IS NAN`` of a null is null; a NaN is greater than nothing (Spark orders
NaN above every number).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from bulldozer.errors import SpecError, SpecIssue

__all__ = ["spark_row_filter"]

_EPOCH = datetime.datetime(1970, 1, 1)
_FIELD = "data_movement.filter"


def spark_row_filter(scan: Any, frame_schema: Any) -> Any:
    """The Column that keeps the rows ``scan`` (a pyiceberg scan with the spec's row filter)
    keeps, over a DataFrame of the table whose Spark schema is ``frame_schema``."""
    from pyiceberg.expressions.visitors import bind, visit

    table_schema = scan.table_metadata.schema()  # what the local engine's scan binds to
    return visit(bind(table_schema, scan.row_filter, scan.case_sensitive), _visitor(table_schema, frame_schema))


def _visitor(table_schema: Any, frame_schema: Any) -> Any:
    from pyiceberg.expressions.visitors import BoundBooleanExpressionVisitor
    from pyiceberg.types import DoubleType, FloatType
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def column(term: Any) -> tuple[Any, Any]:
        """The term's Column and its Spark type, by the field's path of names."""
        path = table_schema.find_column_name(term.ref().field.field_id).split(".")
        col, spark_type = F.col(f"`{path[0].replace('`', '``')}`"), frame_schema
        for i, name in enumerate(path):
            try:
                spark_type = spark_type[name].dataType
            except (KeyError, TypeError):
                message = f"column {'.'.join(path)!r} is not in the table as Spark reads it at the run's snapshot"
                raise SpecError([SpecIssue("spec", _FIELD, message)]) from None
            if i:
                col = col.getField(name)
        return col, spark_type

    def value(raw: Any, spark_type: Any) -> Any:
        """The literal ``raw`` (pyiceberg's value of the field's type) as a Column of ``spark_type``."""
        if isinstance(spark_type, T.DateType):
            return F.lit(datetime.date(1970, 1, 1) + datetime.timedelta(days=raw))
        if isinstance(spark_type, T.TimestampNTZType):  # written as text: no time zone applies
            return F.lit((_EPOCH + datetime.timedelta(microseconds=raw)).isoformat()).cast(spark_type)
        if isinstance(spark_type, T.TimestampType):
            return F.timestamp_micros(F.lit(raw))
        if isinstance(spark_type, T.StringType) and isinstance(raw, bytes | uuid.UUID):  # a uuid, read as text
            return F.lit(str(raw if isinstance(raw, uuid.UUID) else uuid.UUID(bytes=raw)))
        if isinstance(spark_type, T.BinaryType):
            return F.lit(bytearray(raw))
        if isinstance(spark_type, T.StringType | T.BooleanType | T.NumericType):
            return F.lit(raw).cast(spark_type)
        raise SpecError(
            [SpecIssue("spec", _FIELD, f"the Spark engine cannot compare a {spark_type.simpleString()} column")]
        )

    def compare(term: Any, literal: Any, op: str) -> Any:
        col, spark_type = column(term)
        result = getattr(col, op)(value(literal.value, spark_type))
        if op in ("__gt__", "__ge__") and isinstance(term.ref().field.field_type, FloatType | DoubleType):
            result = result & ~F.isnan(col)  # IEEE: a NaN is greater than nothing (Spark: than everything)
        return result

    def contained(term: Any, literals: set[Any]) -> Any:
        col, spark_type = column(term)
        return F.coalesce(col.isin(*[value(v, spark_type) for v in sorted(literals)]), F.lit(False))

    class Visitor(BoundBooleanExpressionVisitor[Any]):
        def visit_in(self, term: Any, literals: set[Any]) -> Any:
            return contained(term, literals)

        def visit_not_in(self, term: Any, literals: set[Any]) -> Any:
            return ~contained(term, literals)

        def visit_is_nan(self, term: Any) -> Any:
            col = column(term)[0]
            return F.when(col.isNotNull(), F.isnan(col))

        def visit_not_nan(self, term: Any) -> Any:
            return ~self.visit_is_nan(term)

        def visit_is_null(self, term: Any) -> Any:
            return column(term)[0].isNull()

        def visit_not_null(self, term: Any) -> Any:
            return column(term)[0].isNotNull()

        def visit_equal(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__eq__")

        def visit_not_equal(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__ne__")

        def visit_greater_than_or_equal(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__ge__")

        def visit_greater_than(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__gt__")

        def visit_less_than(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__lt__")

        def visit_less_than_or_equal(self, term: Any, literal: Any) -> Any:
            return compare(term, literal, "__le__")

        def visit_starts_with(self, term: Any, literal: Any) -> Any:
            return column(term)[0].startswith(F.lit(literal.value))

        def visit_not_starts_with(self, term: Any, literal: Any) -> Any:
            return ~self.visit_starts_with(term, literal)

        def visit_true(self) -> Any:
            return F.lit(True)

        def visit_false(self) -> Any:
            return F.lit(False)

        def visit_not(self, child_result: Any) -> Any:
            return ~child_result

        def visit_and(self, left_result: Any, right_result: Any) -> Any:
            return left_result & right_result

        def visit_or(self, left_result: Any, right_result: Any) -> Any:
            return left_result | right_result

    return Visitor()
