"""gpuops: one shared, carved, observable pool out of siloed GPU servers."""

__version__ = "0.1.0"
