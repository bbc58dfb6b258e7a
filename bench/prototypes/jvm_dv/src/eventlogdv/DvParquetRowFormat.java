package eventlogdv;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructType;

/** As DvParquetFormat, but Spark gets rows (no columnar batches): deleted rows are dropped one by one. */
public class DvParquetRowFormat extends DvParquetFormat {
  @Override public boolean supportBatch(SparkSession spark, StructType schema) { return false; }
}
