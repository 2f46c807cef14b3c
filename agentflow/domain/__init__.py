"""The domain model: the evolving memory, the parsers of module output, the trajectory record, the deadline, and
the conversions between them and their protobuf messages. It imports nothing above it (see docs/architecture.md,
"Layers")."""
