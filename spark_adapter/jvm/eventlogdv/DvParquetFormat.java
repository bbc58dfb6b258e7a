package eventlogdv;

import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.datasources.PartitionedFile;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.*;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import scala.Function1;
import scala.collection.Iterator;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractFunction1;

/**
 * Parquet with deletion vectors. Options:
 *   eventlog.dv.<file name>  base64 of a little-endian long[] (bit r%64 of word r/64 = row r deleted)
 *   eventlog.dv.mode         "compact" (default: the reader drops deleted rows from each batch, in place)
 *                            or "flag" (fills the boolean column named __dv_deleted of the read schema;
 *                            the query filters on it)
 * Row indexes come from Spark's Parquet reader (a column named _tmp_metadata_row_index).
 */
public class DvParquetFormat extends ParquetFileFormat {
  public static final String PREFIX = "eventlog.dv.";
  public static final String MODE = "eventlog.dv.mode";
  public static final String FLAG = "__dv_deleted";

  static String rowIndexName() { return ParquetFileFormat.ROW_INDEX_TEMPORARY_COLUMN_NAME(); }

  @Override
  public Function1<PartitionedFile, Iterator<InternalRow>> buildReaderWithPartitionValues(
      SparkSession spark, StructType dataSchema, StructType partitionSchema, StructType requiredSchema,
      Seq<Filter> filters, Map<String, String> options, Configuration hadoopConf) {
    // Decode the DVs once, on the driver; the map travels with the reader function.
    HashMap<String, long[]> dvs = new HashMap<>();
    String mode = "compact";
    scala.collection.Iterator<scala.Tuple2<String, String>> it = options.iterator();
    while (it.hasNext()) {
      scala.Tuple2<String, String> kv = it.next();
      String k = kv._1();
      if (k.equalsIgnoreCase(MODE)) { mode = kv._2(); continue; }
      if (k.regionMatches(true, 0, PREFIX, 0, PREFIX.length())) {
        byte[] raw = Base64.getDecoder().decode(kv._2());
        long[] words = new long[raw.length / 8];
        ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(words);
        dvs.put(k.substring(PREFIX.length()).toLowerCase(), words);
      }
    }
    // The schema the Parquet reader fills: the required columns without our flag, plus the row index.
    StructField[] req = requiredSchema.fields();
    List<StructField> inner = new ArrayList<>();
    int[] outToInner = new int[req.length];   // -1: the flag column
    int flagPos = -1, rowIdxPos = -1;
    for (int i = 0; i < req.length; i++) {
      if (req[i].name().equals(FLAG)) { outToInner[i] = -1; flagPos = i; continue; }
      if (req[i].name().equals(rowIndexName())) rowIdxPos = inner.size();
      outToInner[i] = inner.size();
      inner.add(req[i]);
    }
    boolean addedRowIdx = false;
    if (rowIdxPos < 0) {
      rowIdxPos = inner.size();
      inner.add(new StructField(rowIndexName(), DataTypes.LongType, true, Metadata.empty()));
      addedRowIdx = true;
    }
    StructType innerSchema = new StructType(inner.toArray(new StructField[0]));
    Seq<Filter> innerFilters = filters;  // filters on __dv_deleted match no Parquet column: ParquetFilters skips them
    Function1<PartitionedFile, Iterator<InternalRow>> base = super.buildReaderWithPartitionValues(
        spark, dataSchema, partitionSchema, innerSchema, innerFilters, options, hadoopConf);
    StructField[] parts = partitionSchema.fields();
    DataType[] types = new DataType[req.length + parts.length];  // the scan's output row
    for (int i = 0; i < req.length; i++) types[i] = req[i].dataType();
    for (int p = 0; p < parts.length; p++) types[req.length + p] = parts[p].dataType();
    int np = partitionSchema.fields().length;
    int[] rowMap = new int[req.length + np];
    for (int i = 0; i < req.length; i++) rowMap[i] = outToInner[i];
    for (int p = 0; p < np; p++) rowMap[req.length + p] = inner.size() + p;
    return new Reader(base, dvs, rowMap, "flag".equalsIgnoreCase(mode), outToInner, flagPos, rowIdxPos,
        inner.size(), partitionSchema.fields().length, types);
  }

  @Override public boolean equals(Object o) { return o == this; }
  @Override public int hashCode() { return System.identityHashCode(this); }
  @Override public String toString() { return "DvParquet"; }

  static final class Reader extends AbstractFunction1<PartitionedFile, Iterator<InternalRow>> implements Serializable {
    final Function1<PartitionedFile, Iterator<InternalRow>> base;
    final HashMap<String, long[]> dvs;
    final int[] rowMap;
    final boolean flagMode;
    final int[] outToInner; final int flagPos, rowIdxPos, innerCols, partCols;
    final DataType[] types;

    Reader(Function1<PartitionedFile, Iterator<InternalRow>> base, HashMap<String, long[]> dvs, int[] rowMap, boolean flagMode,
           int[] outToInner, int flagPos, int rowIdxPos, int innerCols, int partCols, DataType[] types) {
      this.base = base; this.dvs = dvs; this.rowMap = rowMap; this.flagMode = flagMode; this.outToInner = outToInner;
      this.flagPos = flagPos; this.rowIdxPos = rowIdxPos; this.innerCols = innerCols; this.partCols = partCols;
      this.types = types;
    }

    @SuppressWarnings("unchecked")
    @Override public Iterator<InternalRow> apply(PartitionedFile file) {
      long[] bits = dvs.get(file.toPath().getName().toLowerCase());
      // Spark passes ColumnarBatches through Iterator<InternalRow> (erasure): keep the element type Object.
      Iterator<Object> in = (Iterator<Object>) (Iterator<?>) base.apply(file);
      return (Iterator<InternalRow>) (Iterator<?>) new DvIterator(in, bits, this);
    }
  }

  static final class DvIterator extends scala.collection.AbstractIterator<Object> {
    final Iterator<Object> in; final long[] bits; final Reader r;
    ColumnarBatch src, view; OnHeapColumnVector flag; int flagCap; int[] keep = new int[0];
    InternalRow pendingRow; Object pendingBatch; MappedRow mapped;
    org.apache.spark.sql.catalyst.expressions.UnsafeProjection toUnsafe;

    DvIterator(Iterator<Object> in, long[] bits, Reader r) { this.in = in; this.bits = bits; this.r = r; }

    private boolean deleted(long row) {
      int w = (int) (row >>> 6);
      return bits != null && w < bits.length && ((bits[w] >>> row) & 1L) != 0;
    }

    @Override public boolean hasNext() {
      if (pendingRow != null || pendingBatch != null) return true;
      while (in.hasNext()) {
        Object o = in.next();
        if (o instanceof ColumnarBatch) {
          ColumnarBatch b = process((ColumnarBatch) o);
          if (b.numRows() > 0) { pendingBatch = b; return true; }
        } else {
          InternalRow row = (InternalRow) o;
          if (bits == null || !deleted(row.getLong(r.rowIdxPos))) {
            if (mapped == null) mapped = new MappedRow(r.rowMap);
            pendingRow = mapped.wrap(row);
            // Without the vectorized reader Spark takes the Parquet source's rows for UnsafeRows.
            if (row instanceof org.apache.spark.sql.catalyst.expressions.UnsafeRow) {
              if (toUnsafe == null) toUnsafe = org.apache.spark.sql.catalyst.expressions.UnsafeProjection.create(r.types);
              pendingRow = toUnsafe.apply(pendingRow);
            }
            return true;
          }
        }
      }
      return false;
    }

    @Override public Object next() {
      if (!hasNext()) throw new java.util.NoSuchElementException();
      Object o = pendingBatch != null ? pendingBatch : pendingRow;
      pendingBatch = null; pendingRow = null;
      return o;
    }

    private ColumnarBatch process(ColumnarBatch b) {
      int n = b.numRows();
      if (view == null || src != b) {
        src = b;
        ColumnVector[] cols = new ColumnVector[r.outToInner.length + r.partCols];
        if (r.flagMode && r.flagPos >= 0) {
          flagCap = Math.max(n, 4096);
          flag = new OnHeapColumnVector(flagCap, DataTypes.BooleanType);
        }
        for (int i = 0; i < r.outToInner.length; i++) {
          cols[i] = r.outToInner[i] < 0 ? flag : b.column(r.outToInner[i]);
        }
        for (int p = 0; p < r.partCols; p++) cols[r.outToInner.length + p] = b.column(r.innerCols + p);
        view = new ColumnarBatch(cols);
      }
      ColumnVector idx = b.column(r.rowIdxPos);
      if (r.flagMode) {
        if (flag != null) {
          if (flagCap < n) { flag.reserve(n); flagCap = n; }
          for (int i = 0; i < n; i++) flag.putBoolean(i, deleted(idx.getLong(i)));
        }
        view.setNumRows(n);
        return view;
      }
      if (bits == null) { view.setNumRows(n); return view; }
      if (keep.length < n) keep = new int[n];
      int k = 0;
      for (int i = 0; i < n; i++) {
        long row = idx.getLong(i);
        int w = (int) (row >>> 6);
        if (w >= bits.length || ((bits[w] >>> row) & 1L) == 0) keep[k++] = i;
      }
      if (k < n) {
        for (int c = 0; c < r.outToInner.length; c++) {
          ColumnVector v = b.column(r.outToInner[c]);
          compact((WritableColumnVector) v, r.types[c], keep, k);
        }
      }
      view.setNumRows(k);
      return view;
    }
  }

  /** Moves rows keep[0..k) to 0..k, in place (keep is increasing, so keep[j] >= j). */
  static void compact(WritableColumnVector v, DataType t, int[] keep, int k) {
    if (v.isAllNull()) return;
    if (v.hasNull()) {
      for (int j = 0; j < k; j++) { if (v.isNullAt(keep[j])) v.putNull(j); else v.putNotNull(j); }
    }
    if (v.hasDictionary()) {
      WritableColumnVector ids = v.getDictionaryIds();
      for (int j = 0; j < k; j++) ids.putInt(j, ids.getInt(keep[j]));
      return;
    }
    if (t instanceof LongType || t instanceof TimestampType || t instanceof TimestampNTZType) {
      for (int j = 0; j < k; j++) v.putLong(j, v.getLong(keep[j]));
    } else if (t instanceof IntegerType || t instanceof DateType) {
      for (int j = 0; j < k; j++) v.putInt(j, v.getInt(keep[j]));
    } else if (t instanceof DoubleType) {
      for (int j = 0; j < k; j++) v.putDouble(j, v.getDouble(keep[j]));
    } else if (t instanceof FloatType) {
      for (int j = 0; j < k; j++) v.putFloat(j, v.getFloat(keep[j]));
    } else if (t instanceof ShortType) {
      for (int j = 0; j < k; j++) v.putShort(j, v.getShort(keep[j]));
    } else if (t instanceof ByteType) {
      for (int j = 0; j < k; j++) v.putByte(j, v.getByte(keep[j]));
    } else if (t instanceof BooleanType) {
      for (int j = 0; j < k; j++) v.putBoolean(j, v.getBoolean(keep[j]));
    } else if (t instanceof StringType || t instanceof BinaryType) {
      for (int j = 0; j < k; j++) { int i = keep[j]; v.putArray(j, v.getArrayOffset(i), v.getArrayLength(i)); }
    } else {
      throw new UnsupportedOperationException("deletion vectors: no in-place compaction for " + t);
    }
  }
}
