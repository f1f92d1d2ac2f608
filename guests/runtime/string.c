/*
 * mem* and str* helpers.  The bulk copies use rep movs/stos in 8-byte units:
 * unprivileged, and far fewer instructions for the emulator that runs CPL 0
 * guest code on some hosts.  Built with -fno-tree-loop-distribute-patterns
 * so that GCC does not turn these loops back into calls to themselves.
 */
#include "rt.h"

/*
 * The C library names are weak: a program written against solo5.h brings
 * its own mem and str functions (Solo5's tests include bindings/lib.c; a
 * MirageOS build has its libc), and Solo5's bindings export nothing but
 * the solo5_ API, so those definitions must win here without a clash.
 * The runtime's own calls then use the program's, which do the same.
 */
#define RT_LIBC __attribute__((weak))

#if defined(__aarch64__)
/* aarch64: plain loops (GCC keeps them loops: see the flag above). */
RT_LIBC void *memset(void *dst, int c, size_t n)
{
    uint8_t *d = dst;
    while (n--)
        *d++ = (uint8_t)c;
    return dst;
}

RT_LIBC void *memcpy(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    for (; n >= 8; n -= 8, d += 8, s += 8)
        __builtin_memcpy(d, s, 8);
    while (n--)
        *d++ = *s++;
    return dst;
}
#else
RT_LIBC void *memset(void *dst, int c, size_t n)
{
    uint64_t pattern = 0x0101010101010101ULL * (uint8_t)c;
    void *d = dst;
    size_t words = n / 8, bytes = n % 8;

    __asm__ __volatile__("cld; rep stosq"
                         : "+D"(d), "+c"(words)
                         : "a"(pattern)
                         : "memory");
    __asm__ __volatile__("rep stosb"
                         : "+D"(d), "+c"(bytes)
                         : "a"(pattern)
                         : "memory");
    return dst;
}

RT_LIBC void *memcpy(void *dst, const void *src, size_t n)
{
    void *d = dst;
    const void *s = src;
    size_t words = n / 8, bytes = n % 8;

    __asm__ __volatile__("cld; rep movsq"
                         : "+D"(d), "+S"(s), "+c"(words)
                         :
                         : "memory");
    __asm__ __volatile__("rep movsb"
                         : "+D"(d), "+S"(s), "+c"(bytes)
                         :
                         : "memory");
    return dst;
}
#endif

RT_LIBC void *memmove(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;

    if (d <= s || d >= s + n)
        return memcpy(dst, src, n);
    /* Overlapping with dst above src: copy backwards. */
    while (n > 0) {
        n--;
        d[n] = s[n];
    }
    return dst;
}

RT_LIBC int memcmp(const void *a, const void *b, size_t n)
{
    const uint8_t *p = a, *q = b;
    size_t i = 0;

    /* Skip equal 8-byte words quickly, then find the first differing byte. */
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        __builtin_memcpy(&x, p + i, 8);
        __builtin_memcpy(&y, q + i, 8);
        if (x != y)
            break;
    }
    for (; i < n; i++) {
        if (p[i] != q[i])
            return p[i] < q[i] ? -1 : 1;
    }
    return 0;
}

RT_LIBC size_t strlen(const char *s)
{
    size_t n = 0;
    while (s[n] != '\0')
        n++;
    return n;
}

RT_LIBC size_t strnlen(const char *s, size_t max)
{
    size_t n = 0;
    while (n < max && s[n] != '\0')
        n++;
    return n;
}

RT_LIBC int strcmp(const char *a, const char *b)
{
    while (*a != '\0' && *a == *b) {
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

RT_LIBC int strncmp(const char *a, const char *b, size_t n)
{
    for (; n > 0; n--, a++, b++) {
        if (*a != *b)
            return (unsigned char)*a - (unsigned char)*b;
        if (*a == '\0')
            return 0;
    }
    return 0;
}

RT_LIBC char *strchr(const char *s, int c)
{
    for (;; s++) {
        if (*s == (char)c)
            return (char *)s;
        if (*s == '\0')
            return NULL;
    }
}
