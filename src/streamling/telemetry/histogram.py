"""Histograms fed with counts Spark bucketed, so a per-row histogram costs no per-row Python.

Streamling observes ``streamling_event_time_lag`` once per row. Here rows never reach the driver:
the epoch's observation of a node (``runtime.observe``, filled by the sinks' own jobs) computes, next
to its row count, how many rows fall in each bucket of the histogram and the lags' sum
(``runtime.epoch_dag.event_time_aggregates``). Those become a :class:`Buckets` (pure Python, no
OpenTelemetry) carried by ``EpochFlushed``.

The OpenTelemetry SDK's histogram takes one value per ``record()``; recording a representative
value ``n`` times per bucket would cost O(rows) on the driver. Instead the lag instrument gets a
View whose aggregation is the SDK's explicit-bucket histogram with one addition: a measurement that
carries a :class:`Buckets` in its context adds the whole batch at once (bucket counts, count, sum),
in O(buckets). What is exported is then what recording each row would have given: the same bucket
boundaries (:data:`LAG_BOUNDARIES_MS`, the SDK's and Streamling's default ones, used both by Spark
and by the View), exact bucket counts and count, and the sum of the per-row lags as Spark added them
in double precision. Min and max are not recorded for this histogram (OTLP's fields are optional;
Prometheus never shows them): each would cost every row one more aggregate. Temporality (cumulative
for Prometheus and OTLP, delta where a reader asks for it) is the SDK's own.

The hook reaches into the SDK's private aggregation state (``_value``, ``_sum``);
:func:`bucketed_supported` checks it once per run, and an SDK that changed it gets a plain
histogram fed one value per non-empty bucket (the buckets stay right, the count does not), with one
log line saying so.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opentelemetry.metrics import Histogram
    from opentelemetry.sdk.metrics.view import View

log = logging.getLogger(__name__)
#: upper bounds (ms, inclusive) of the lag buckets: OpenTelemetry's default explicit boundaries, which
#: Streamling's histograms use too; the last bucket holds everything above 10 s
LAG_BOUNDARIES_MS: tuple[float, ...] = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0,
                                         2500.0, 5000.0, 7500.0, 10000.0)
_CONTEXT_KEY = "streamling.bucketed_histogram"


@dataclass(frozen=True)
class Buckets:
    """Per-bucket counts of a batch of values (``counts[i]`` holds values in ``(b[i-1], b[i]]``, the
    last one values above every boundary, as OpenTelemetry buckets them), with their sum."""

    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    @classmethod
    def of(cls, values: Sequence[float], boundaries: Sequence[float] = LAG_BOUNDARIES_MS) -> Buckets:
        """``values`` bucketed one by one, as the SDK buckets a recorded value (tests, fallbacks)."""
        counts = [0] * (len(boundaries) + 1)
        for value in values:
            counts[bisect.bisect_left(boundaries, value)] += 1
        return cls(tuple(counts), float(sum(values)))


def record_buckets(histogram: Histogram, buckets: Buckets, attributes: dict[str, str],
                   bucketed: bool = True) -> None:
    """Add ``buckets`` to ``histogram`` as if each value had been recorded (see the module doc)."""
    if buckets.count <= 0:
        return
    if not bucketed:  # an SDK without the hook: one value per non-empty bucket
        for i, n in enumerate(buckets.counts):
            if n:  # the bucket's upper bound; above the last one, just past it
                histogram.record(LAG_BOUNDARIES_MS[i] if i < len(LAG_BOUNDARIES_MS) else LAG_BOUNDARIES_MS[-1] + 1.0,
                                 attributes)
        return
    from opentelemetry.context import set_value

    histogram.record(max(0.0, buckets.sum), attributes, context=set_value(_CONTEXT_KEY, buckets))


def _aggregation_class() -> type[Any]:
    from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation

    class BucketedHistogramAggregation(_ExplicitBucketHistogramAggregation):  # type: ignore[misc]
        """The SDK's explicit-bucket histogram; a measurement carrying ``Buckets`` adds them all."""

        def aggregate(self, measurement: Any, should_sample_exemplar: bool = True) -> None:
            context = measurement.context
            batch = context.get(_CONTEXT_KEY) if context is not None else None
            if not isinstance(batch, Buckets):
                super().aggregate(measurement, should_sample_exemplar)
                return
            if len(batch.counts) != len(self._boundaries) + 1:
                raise ValueError(f"{len(batch.counts)} bucket counts for {len(self._boundaries)} boundaries")
            with self._lock:
                value: list[int] = self._value if self._value is not None else self._get_empty_bucket_counts()
                for i, n in enumerate(batch.counts):
                    value[i] += n
                self._value = value  # type: ignore[assignment]
                self._sum += batch.sum  # type: ignore[assignment]

    return BucketedHistogramAggregation


def bucketed_view(instrument_name: str, boundaries: Sequence[float] = LAG_BOUNDARIES_MS) -> View:
    """A View giving ``instrument_name`` an explicit-bucket histogram that accepts ``Buckets``."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    aggregation_class = _aggregation_class()

    class Bucketed(ExplicitBucketHistogramAggregation):
        def _create_aggregation(self, *args: Any, **kwargs: Any) -> Any:
            created = super()._create_aggregation(*args, **kwargs)
            created.__class__ = aggregation_class  # same state, one more way to aggregate
            return created

    return View(instrument_name=instrument_name,
                aggregation=Bucketed(boundaries=list(boundaries), record_min_max=False))


def bucketed_supported() -> bool:
    """Whether this OpenTelemetry SDK takes ``Buckets`` (a histogram fed one batch reports it exactly)."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader], views=[bucketed_view("probe")])
        batch = Buckets((1, 2, *([0] * (len(LAG_BOUNDARIES_MS) - 2)), 3), 60_012.0)
        record_buckets(provider.get_meter("probe").create_histogram("probe"), batch, {})
        data = reader.get_metrics_data()
        provider.shutdown()
        assert data is not None
        [point] = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
        if not isinstance(point, HistogramDataPoint):
            return False
        return (tuple(point.bucket_counts), point.count, point.sum) == (batch.counts, 6, 60_012.0)
    except Exception:  # noqa: BLE001 - an SDK whose internals moved: the plain fallback
        log.debug("the bucketed histogram hook does not fit this OpenTelemetry SDK", exc_info=True)
        return False
