"""Decoding of PostgreSQL's pgoutput logical replication protocol (versions 1-4). Pure: no I/O."""

from cdcd.pgoutput.decoder import Decoder, read_tuple
from cdcd.pgoutput.errors import DecodeError

__all__ = ["DecodeError", "Decoder", "read_tuple"]
