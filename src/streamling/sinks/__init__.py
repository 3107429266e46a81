"""Built-in sinks; each module is imported only when a pipeline uses its ``type``."""
