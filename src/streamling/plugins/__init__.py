"""streamling's plugin API: sources, transforms, sinks, preprocessors, side outputs and SQL UDFs in
Python, exchanging ``pyarrow.RecordBatch``es with the runtime.

    from streamling.plugins import SourcePlugin, source

    @source("acme.orders")
    class Orders(SourcePlugin):
        ...

Plugins are found through the ``streamling.plugins`` entry-point group and ``STREAMLING__PLUGIN__PATH``;
``streamling plugins`` lists what is installed, ``streamling.plugins.testing`` drives a plugin
through epochs, crashes and restarts without Spark.
"""

from streamling.plugins.api import (
    MetricsRecorder,
    NoOptions,
    Offset,
    Plugin,
    PluginContext,
    PluginEpoch,
    PluginState,
    PreprocessorPlugin,
    SideOutputPlugin,
    SinkPlugin,
    SourcePlugin,
    TransformPlugin,
    TransientError,
)
from streamling.plugins.registry import preprocessor, side_output, sink, source, transform, udf

__all__ = [
    "MetricsRecorder", "NoOptions", "Offset", "Plugin", "PluginContext", "PluginEpoch", "PluginState",
    "PreprocessorPlugin", "SideOutputPlugin", "SinkPlugin", "SourcePlugin", "TransformPlugin", "TransientError",
    "preprocessor", "side_output", "sink", "source", "transform", "udf",
]
