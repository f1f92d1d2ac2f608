/* A bump allocator over the heap; memory is never given back. */
#include "rt_internal.h"

static uintptr_t heap_next, heap_end;

void rt_heap_init(uintptr_t start, uintptr_t end)
{
    heap_next = start;
    heap_end = end > start ? end : start;
}

void *rt_alloc(size_t size, size_t align)
{
    if (align == 0 || (align & (align - 1)) != 0)
        return NULL;
    uintptr_t p = (heap_next + align - 1) & ~(uintptr_t)(align - 1);
    if (p < heap_next || p > heap_end || size > heap_end - p)
        return NULL;
    heap_next = p + size;
    return (void *)p;
}
