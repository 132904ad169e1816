"""Transaction assembly: messages in, committed transactions out, with bounded memory (spilling to disk)."""

from cdcd.assembly.assembler import Assembler, AssemblyError, Event
from cdcd.assembly.buffer import BufferPool, ChangeBuffer

__all__ = ["Assembler", "AssemblyError", "BufferPool", "ChangeBuffer", "Event"]
