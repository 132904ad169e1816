"""Replication: the pure core (frames in, events out), the session start policy, and the I/O loop around them."""
