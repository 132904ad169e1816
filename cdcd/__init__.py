"""cdcd: PostgreSQL logical replication (pgoutput) to Kafka change-data-capture daemon."""

__version__ = "0.1.0"
