"""The prefill->decode hand-off as KV connectors: priced on the virtual clock (``sim``), copied between
engines of one process (``local``), sent between engine processes (``process``)."""
