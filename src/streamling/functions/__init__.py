"""SQL functions streamling adds to Spark SQL (``dynamic_table_check``, …)."""
