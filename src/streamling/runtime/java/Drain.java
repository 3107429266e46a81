package streamling.spark;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution;

import scala.Option;

/**
 * Runs a DataFrame's whole physical plan and counts its rows, storing nothing.
 *
 * <p>What Spark's {@code noop} writer does (every column of every row computed), plus the row
 * count, which the {@code blackhole} sink would otherwise have to observe with a
 * {@code CollectMetrics} operator that splits the generated code. The job runs as one SQL
 * execution, so observations and the UI see it like any other action.
 */
public final class Drain {
    private Drain() {
    }

    /** Executes {@code ds}'s plan once, reading every row; returns the number of rows. */
    public static long count(Dataset<?> ds, String description) {
        // A fresh execution of the analysed plan, as a writer's command would run it: a DataFrame
        // made by SQL over temp views keeps its parsed plan as "logical", where the observations
        // inside the views' plans cannot be found to be completed.
        Dataset<Row> fresh = Dataset.ofRows(ds.sparkSession(), ds.logicalPlan());
        QueryExecution qe = fresh.queryExecution();
        scala.Function0<Long> body = () -> qe.toRdd().count();
        return SQLExecution.withNewExecutionId(qe, Option.apply(description), body);
    }
}
