"""``format("hamq")``: the PySpark data source (pure Python Data Source API, no jars)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import DataType, MapType, StringType, StructType

from hamq.spark.options import ReadOptions, WriteOptions
from hamq.spark.reader import HamqBatchReader, HamqStreamReader
from hamq.spark.schema import SPARK_SCHEMA, WRITE_COLUMNS, read_columns
from hamq.spark.writer import HamqBatchWriter, HamqStreamWriter


class HamqDataSource(DataSource):
    """Options as Spark's Kafka source: ``namesrv``, ``topic``, ``startingOffsets``,
    ``endingOffsets``, ``maxRecordsPerTrigger``, plus ``group`` and
    ``maxRecordsPerPartition`` (see the README's Spark section). A read produces the
    columns of the schema it is given: ``.schema("value binary")`` reads values only."""

    @classmethod
    def name(cls) -> str:
        return "hamq"

    def schema(self) -> StructType:
        """Every column, ``properties`` (Kafka's headers) only with ``includeHeaders``."""
        if self.options.get("includeheaders", "true").lower() == "false":
            return StructType([f for f in SPARK_SCHEMA.fields if f.name != "properties"])
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> HamqBatchReader:
        return HamqBatchReader(ReadOptions.parse(self.options), columns=read_columns(schema))

    def streamReader(self, schema: StructType) -> HamqStreamReader:
        return HamqStreamReader(ReadOptions.parse(self.options), columns=read_columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> HamqBatchWriter:
        return HamqBatchWriter(self._write_options(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> HamqStreamWriter:
        return HamqStreamWriter(self._write_options(schema, overwrite))

    def _write_options(self, schema: StructType, overwrite: bool) -> WriteOptions:
        if overwrite:
            raise ValueError("the hamq sink only appends: use mode('append')")
        check_write_schema(schema)
        options = WriteOptions.parse(self.options)
        if options.topic is None and "topic" not in schema.fieldNames():
            raise ValueError("the hamq sink needs option 'topic' or a 'topic' column")
        return options


def check_write_schema(schema: StructType) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ValueError(
            f"the hamq sink needs a 'value' column (binary or string); the data "
            f"has {sorted(fields)}"
        )
    for name, data_type in fields.items():
        allowed = WRITE_COLUMNS.get(name)
        if allowed is None:
            raise ValueError(
                f"the hamq sink does not take column {name!r}; it takes {sorted(WRITE_COLUMNS)}"
            )
        if not isinstance(data_type, allowed) or not _string_map_or_other(data_type):
            raise ValueError(
                f"the hamq sink's {name!r} column must be "
                f"{' or '.join(t.typeName() for t in allowed)}, not "
                f"{data_type.simpleString()}"
            )


def _string_map_or_other(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return isinstance(data_type.keyType, StringType) and isinstance(
            data_type.valueType, StringType
        )
    return True
