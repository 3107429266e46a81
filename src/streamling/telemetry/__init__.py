"""Operating a run: metrics (OpenTelemetry), the numbers behind them, and the admin API."""
