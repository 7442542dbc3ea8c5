"""The Keel lab: run real servers and micro workloads under any allocator and compare."""

__version__ = "0.1.0"
