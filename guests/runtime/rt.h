/*
 * pyvmm guest runtime: what programs get beyond the Solo5 API.
 * Console formatting, string helpers, boot information, a bump allocator.
 */
#ifndef RT_H
#define RT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hvt_abi.h"
#include "manifest.h"
#include "solo5.h"

/* Console: rt_puts writes the string as is (no newline added). */
void rt_puts(const char *s);
/* printf subset: %d %i %u %x %X %p %s %c %% with flags '-' and '0', a field
 * width (digits or '*') and the length modifiers l, ll, z. */
int rt_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int rt_vprintf(const char *fmt, va_list ap);
int rt_snprintf(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int rt_vsnprintf(char *buf, size_t size, const char *fmt, va_list ap);

/* Memory and strings (the compiler may also call the mem* ones itself). */
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
size_t strnlen(const char *s, size_t max);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);

/* Parse a decimal number at *s, advance *s past it.  False if there is no
 * digit or the value does not fit in 64 bits. */
bool rt_parse_u64(const char **s, uint64_t *value);
/* Skip spaces; return the start of the next word (may be the final NUL). */
const char *rt_skip_spaces(const char *s);

/* The boot information the tender passed at entry (read-only). */
const struct hvt_boot_info *rt_boot_info(void);
/* The host's filled-in manifest (mac, mtu, capacity, block_size, attached). */
const struct mft *rt_manifest(void);

/* The privilege level the guest runs at: 0 (kernel mode, as under stock
 * solo5-hvt) or 3 (user mode, which pyvmm may choose because the runtime's
 * capability note declares it; see caps_note.c).  Read from %cs, which is
 * unprivileged. */
int rt_cpl(void);

/* Memory from the heap, aligned to (align) (a power of two), never freed.
 * The top RT_STACK_RESERVE bytes of the heap are left to the stack.
 * Returns NULL when the heap is exhausted. */
#define RT_STACK_RESERVE (256 * 1024)
void *rt_alloc(size_t size, size_t align);

#endif
