"""The PostgreSQL side: walsender connection (I/O) and the replication protocol framing (pure)."""
