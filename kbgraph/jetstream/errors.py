"""The refusals of the JetStream log that the webhook endpoint answers with (``kbgraph.ingest``).

Apart from the modules that raise them so that the core, which catches them, imports without
the ``jetstream`` extra (nats-py) installed.
"""


class LogUnavailable(RuntimeError):
    """The stream did not take the delivery, or it is not applied here (yet): 503."""


class DeliverySkipped(RuntimeError):
    """The delivery is one an operator's decision skipped on every node (409)."""


class DeliveryTooLarge(ValueError):
    """The delivery, compressed, is over the NATS servers' ``max_payload`` (413)."""
