"""Built-in block allocators."""

from .contiguous import ContiguousAllocator
from .paged import PagedAllocator

BUILTIN = [PagedAllocator, ContiguousAllocator]
