package eventlogdv;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.CalendarInterval;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.unsafe.types.VariantVal;

/** A view of a reader row in the scan's output order: ordinal i reads inner ordinal map[i]; -1 is the
 *  deletion flag, always false (the rows a DV deletes are dropped before they get here). */
final class MappedRow extends InternalRow {
  private final int[] map;
  private InternalRow row;

  MappedRow(int[] map) { this.map = map; }
  MappedRow wrap(InternalRow r) { this.row = r; return this; }

  @Override public int numFields() { return map.length; }
  @Override public void setNullAt(int i) { throw new UnsupportedOperationException(); }
  @Override public void update(int i, Object v) { throw new UnsupportedOperationException(); }
  @Override public InternalRow copy() {
    throw new UnsupportedOperationException("copy");  // FileSourceScanExec projects to UnsafeRow: never called there
  }
  @Override public boolean isNullAt(int i) { return map[i] >= 0 && row.isNullAt(map[i]); }
  @Override public boolean getBoolean(int i) { return map[i] >= 0 && row.getBoolean(map[i]); }
  @Override public byte getByte(int i) { return row.getByte(map[i]); }
  @Override public short getShort(int i) { return row.getShort(map[i]); }
  @Override public int getInt(int i) { return row.getInt(map[i]); }
  @Override public long getLong(int i) { return row.getLong(map[i]); }
  @Override public float getFloat(int i) { return row.getFloat(map[i]); }
  @Override public double getDouble(int i) { return row.getDouble(map[i]); }
  @Override public Decimal getDecimal(int i, int p, int s) { return row.getDecimal(map[i], p, s); }
  @Override public UTF8String getUTF8String(int i) { return row.getUTF8String(map[i]); }
  @Override public byte[] getBinary(int i) { return row.getBinary(map[i]); }
  @Override public CalendarInterval getInterval(int i) { return row.getInterval(map[i]); }
  @Override public org.apache.spark.unsafe.types.BinaryView getBinaryView(int i) { return row.getBinaryView(map[i]); }
  @Override public org.apache.spark.unsafe.types.TimestampNanosVal getTimestampNTZNanos(int i) { return row.getTimestampNTZNanos(map[i]); }
  @Override public org.apache.spark.unsafe.types.TimestampNanosVal getTimestampLTZNanos(int i) { return row.getTimestampLTZNanos(map[i]); }
  @Override public VariantVal getVariant(int i) { return row.getVariant(map[i]); }
  @Override public InternalRow getStruct(int i, int n) { return row.getStruct(map[i], n); }
  @Override public ArrayData getArray(int i) { return row.getArray(map[i]); }
  @Override public MapData getMap(int i) { return row.getMap(map[i]); }
  @Override public Object get(int i, DataType t) { return map[i] < 0 ? Boolean.FALSE : row.get(map[i], t); }
}
