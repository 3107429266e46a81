package streamling.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The row indexes of streamling's {@code generate} source, as a JVM streaming source.
 *
 * <p>It yields one column, {@code idx}: the rows {@code [start, end)} of each epoch in order, split
 * into contiguous ranges, one per partition. The columns of a row are Spark expressions of its
 * index (see {@code streamling/sources/generate_rows.py}), so reading a batch needs no Python worker.
 *
 * <p>Offsets, epoch sizes, the row ceiling of a bounded source and the clock of a rate-limited one
 * are those of the Python data source of the same options: offsets are {@code {"row": N}} in both,
 * so either resumes the other's checkpoint.
 */
public final class GenerateSource implements TableProvider {
  // Nullable, as every column of the Python source is: the expressions over it are too.
  static final StructType SCHEMA = new StructType().add("idx", DataTypes.LongType, true);

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new GenerateTable();
  }

  static final class GenerateTable implements Table, SupportsRead {
    @Override
    public String name() {
      return "streamling_generate";
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return SCHEMA;
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          return new Stream(options);
        }
      };
    }
  }

  /** {@code {"row": N}}, the offset JSON of the Python data source too. */
  static final class RowOffset extends Offset {
    private static final Pattern JSON = Pattern.compile("\\{\\s*\"row\"\\s*:\\s*(-?\\d+)\\s*}");
    final long row;

    RowOffset(long row) {
      this.row = row;
    }

    static RowOffset of(Offset offset) {
      if (offset == null) {
        return new RowOffset(0);
      }
      return offset instanceof RowOffset ? (RowOffset) offset : parse(offset.json());
    }

    static RowOffset parse(String json) {
      Matcher m = JSON.matcher(json.trim());
      if (!m.matches()) {
        throw new IllegalArgumentException("not a generate source offset: " + json);
      }
      return new RowOffset(Long.parseLong(m.group(1)));
    }

    @Override
    public String json() {
      return "{\"row\": " + row + "}";
    }
  }

  static final class Range implements InputPartition {
    final long start;
    final long end;

    Range(long start, long end) {
      this.start = start;
      this.end = end;
    }
  }

  static final class Stream implements MicroBatchStream, SupportsTriggerAvailableNow {
    private final Long total;
    private final Double rate;
    private final long perBatch;
    private final int partitions;
    // The clock of a rate-limited source: (monotonic seconds, row) it started from.
    private double clockStart = Double.NaN;
    private long clockBase;
    private boolean availableNow;
    private Long availableNowEnd;

    Stream(CaseInsensitiveStringMap options) {
      String rows = options.get("rows");
      String rowsPerSecond = options.get("rows_per_second");
      this.total = present(rows) ? Long.valueOf(rows) : null;
      this.rate = present(rowsPerSecond) ? Double.valueOf(rowsPerSecond) : null;
      this.perBatch = Long.parseLong(options.getOrDefault("rows_per_batch", "100000"));
      this.partitions = Integer.parseInt(options.getOrDefault("partitions", "2"));
    }

    private static boolean present(String value) {
      return value != null && !value.isEmpty() && !value.equals("None");
    }

    private long ceiling(long start) {
      long ceiling = total != null ? total : 1L << 62;
      if (rate != null) {
        double now = System.nanoTime() / 1e9;
        if (Double.isNaN(clockStart)) {
          // One second (at least one row) in the past, so that the first epoch is not empty.
          clockStart = now - Math.max(1.0, 1.0 / rate);
          clockBase = start;
        }
        ceiling = Math.min(ceiling, clockBase + (long) ((now - clockStart) * rate));
      }
      if (availableNow && total == null) {
        if (availableNowEnd == null) {
          availableNowEnd = ceiling;  // drain what the clock has released so far, then stop
        }
        ceiling = Math.min(ceiling, availableNowEnd);
      }
      return ceiling;
    }

    @Override
    public Offset initialOffset() {
      return new RowOffset(0);
    }

    @Override
    public Offset latestOffset() {
      throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is the one to call");
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
      long begin = RowOffset.of(startOffset).row;
      return new RowOffset(Math.max(begin, Math.min(begin + perBatch, ceiling(begin))));
    }

    @Override
    public void prepareForTriggerAvailableNow() {
      availableNow = true;
    }

    @Override
    public Offset deserializeOffset(String json) {
      return RowOffset.parse(json);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      long lo = RowOffset.of(start).row;
      long hi = RowOffset.of(end).row;
      if (hi <= lo) {
        return new InputPartition[0];
      }
      long n = Math.max(1, Math.min(partitions, hi - lo));
      long step = (hi - lo + n - 1) / n;
      List<InputPartition> out = new ArrayList<>();
      for (long s = lo; s < hi; s += step) {
        out.add(new Range(s, Math.min(s + step, hi)));
      }
      return out.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new Readers();
    }

    @Override
    public void commit(Offset end) {
    }

    @Override
    public void stop() {
    }
  }

  static final class Readers implements PartitionReaderFactory {
    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      Range range = (Range) partition;
      return new PartitionReader<InternalRow>() {
        private final GenericInternalRow row = new GenericInternalRow(1);
        private long cursor = range.start;

        @Override
        public boolean next() {
          if (cursor >= range.end) {
            return false;
          }
          row.setLong(0, cursor++);
          return true;
        }

        @Override
        public InternalRow get() {
          return row;
        }

        @Override
        public void close() {
        }
      };
    }
  }
}
