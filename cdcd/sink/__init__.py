"""Where committed changes go: JSON lines (``cdcd tail``); Kafka arrives with the Kafka output stage."""
