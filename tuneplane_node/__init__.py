"""tuneplane-node: the node daemon of the TunePlane fine-tuning platform."""

__version__ = "0.1.0"
