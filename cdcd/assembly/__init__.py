"""Transaction assembly: messages in, committed transactions out, with bounded memory. Pure: no I/O."""

from cdcd.assembly.assembler import Assembler, AssemblyError, Event, Transaction
from cdcd.assembly.buffer import BufferPool, ChangeBuffer

__all__ = ["Assembler", "AssemblyError", "BufferPool", "ChangeBuffer", "Event", "Transaction"]
