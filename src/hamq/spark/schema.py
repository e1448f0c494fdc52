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
