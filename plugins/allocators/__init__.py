"""Built-in block allocators."""

from .paged import PagedAllocator

BUILTIN = [PagedAllocator]
