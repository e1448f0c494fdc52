"""The hamq source's row shape, in Spark's and Arrow's terms (they must agree exactly:
Spark refuses an Arrow batch whose types or nullability differ from the schema)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("broker", StringType()),
        StructField("queue", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("tags", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
    ]
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("broker", pa.string()),
        pa.field("queue", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("tags", pa.string()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
    ]
)

# What a write takes: ``value`` is required, the rest optional (Spark's Kafka sink names).
WRITE_COLUMNS = {
    "value": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "tags": (StringType,),
    "properties": (MapType,),
    "topic": (StringType,),
}

# What a read produces unless the query's schema says otherwise: every column.
READ_COLUMNS = tuple(SPARK_SCHEMA.fieldNames())


def read_columns(schema: StructType) -> tuple[str, ...]:
    """The columns a read produces: the fields of the schema Spark hands the reader, which
    is SPARK_SCHEMA or the user's ``.schema(...)``. Spark's Python data sources get no
    column pruning (``count()`` and ``select`` still ask for every column), so a user
    schema is how a job reads less: any subset of SPARK_SCHEMA's fields, in any order,
    by their names and types (an empty one reads row counts only)."""
    known = {f.name: f.dataType for f in SPARK_SCHEMA.fields}
    seen: set[str] = set()
    for field in schema.fields:
        expected = known.get(field.name)
        if expected is None:
            raise ValueError(
                f"the hamq source has no column {field.name!r}; a schema it reads takes "
                f"columns of {', '.join(READ_COLUMNS)}"
            )
        if field.dataType != expected:
            raise ValueError(
                f"the hamq source's column {field.name!r} is {expected.simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        if not field.nullable:
            raise ValueError(
                f"the hamq source's column {field.name!r} must be nullable in the schema "
                "(drop NOT NULL)"
            )
        if field.name in seen:
            raise ValueError(f"the hamq source's column {field.name!r} is in the schema twice")
        seen.add(field.name)
    return tuple(schema.fieldNames())


def arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The Arrow batches' schema for ``columns`` (from ``read_columns``)."""
    return pa.schema([ARROW_SCHEMA.field(name) for name in columns])
