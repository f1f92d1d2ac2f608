/*
 * A small printf: enough for test output and aligned tables.
 * Conversions d i u x X p s c %; flags '-' '0'; width (digits or *);
 * precision for %s only (.N or .*); length modifiers hh h l ll z.
 * Output goes to a sink: a caller's buffer (snprintf, truncating) or a
 * stack buffer flushed to the console in one hypercall per printf call
 * (more only when the text exceeds the buffer).
 */
#include "rt.h"

struct sink {
    char *buf;
    size_t cap;      /* bytes buf can take */
    size_t len;      /* bytes in buf */
    size_t total;    /* bytes produced, like printf's return value */
    bool console;    /* flush to the console when full */
};

static void sink_flush(struct sink *o)
{
    if (o->console && o->len > 0)
        solo5_console_write(o->buf, o->len);
    o->len = 0;
}

static void put(struct sink *o, char c)
{
    o->total++;
    if (o->len == o->cap) {
        if (!o->console)
            return;
        sink_flush(o);
    }
    o->buf[o->len++] = c;
}

static void pad(struct sink *o, char c, int n)
{
    while (n-- > 0)
        put(o, c);
}

struct spec {
    bool left, zero;
    int width;
    int precision; /* -1: none */
};

static void put_number(struct sink *o, const struct spec *sp, uint64_t v,
        unsigned base, bool upper, bool negative, const char *prefix)
{
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    char tmp[24];
    int n = 0;

    do {
        tmp[n++] = digits[base == 16 ? (v & 15) : (v % 10)];
        v = base == 16 ? v >> 4 : v / 10;
    } while (v != 0);

    int extra = (negative ? 1 : 0) + (int)strlen(prefix);
    int fill = sp->width - n - extra;

    if (!sp->left && !sp->zero)
        pad(o, ' ', fill);
    if (negative)
        put(o, '-');
    while (*prefix != '\0')
        put(o, *prefix++);
    if (!sp->left && sp->zero)
        pad(o, '0', fill);
    while (n > 0)
        put(o, tmp[--n]);
    if (sp->left)
        pad(o, ' ', fill);
}

static void put_string(struct sink *o, const struct spec *sp, const char *s)
{
    if (s == NULL)
        s = "(null)";
    int n = (int)(sp->precision >= 0 ? strnlen(s, (size_t)sp->precision)
                                      : strlen(s));
    if (!sp->left)
        pad(o, ' ', sp->width - n);
    for (int i = 0; i < n; i++)
        put(o, s[i]);
    if (sp->left)
        pad(o, ' ', sp->width - n);
}

static void format(struct sink *o, const char *fmt, va_list ap)
{
    while (*fmt != '\0') {
        if (*fmt != '%') {
            put(o, *fmt++);
            continue;
        }
        fmt++;

        struct spec sp = { .left = false, .zero = false, .width = 0, .precision = -1 };
        for (;; fmt++) {
            if (*fmt == '-')
                sp.left = true;
            else if (*fmt == '0')
                sp.zero = true;
            else
                break;
        }
        if (*fmt == '*') {
            sp.width = va_arg(ap, int);
            if (sp.width < 0) {
                sp.left = true;
                sp.width = -sp.width;
            }
            fmt++;
        } else {
            while (*fmt >= '0' && *fmt <= '9')
                sp.width = sp.width * 10 + (*fmt++ - '0');
        }
        if (*fmt == '.') {
            fmt++;
            sp.precision = 0;
            if (*fmt == '*') {
                sp.precision = va_arg(ap, int);
                fmt++;
            } else {
                while (*fmt >= '0' && *fmt <= '9')
                    sp.precision = sp.precision * 10 + (*fmt++ - '0');
            }
        }

        int longs = 0; /* 0 int, 1 long, 2 long long; size_t counts as long */
        for (;; fmt++) {
            if (*fmt == 'l')
                longs++;
            else if (*fmt == 'z')
                longs = 1;
            else if (*fmt != 'h')  /* hh and h: promoted to int anyway */
                break;
        }

        char conv = *fmt;
        if (conv == '\0')
            break;
        fmt++;

        switch (conv) {
        case 'd':
        case 'i': {
            int64_t v = longs == 0 ? va_arg(ap, int)
                      : longs == 1 ? va_arg(ap, long) : va_arg(ap, long long);
            uint64_t mag = v < 0 ? -(uint64_t)v : (uint64_t)v;
            put_number(o, &sp, mag, 10, false, v < 0, "");
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = longs == 0 ? va_arg(ap, unsigned int)
                       : longs == 1 ? va_arg(ap, unsigned long)
                                    : va_arg(ap, unsigned long long);
            put_number(o, &sp, v, conv == 'u' ? 10 : 16, conv == 'X', false, "");
            break;
        }
        case 'p':
            put_number(o, &sp, (uintptr_t)va_arg(ap, void *), 16, false, false, "0x");
            break;
        case 's':
            put_string(o, &sp, va_arg(ap, const char *));
            break;
        case 'c': {
            char c[2] = { (char)va_arg(ap, int), '\0' };
            sp.precision = 1;
            put_string(o, &sp, c);
            break;
        }
        case '%':
            put(o, '%');
            break;
        default: /* unknown: show it as written */
            put(o, '%');
            put(o, conv);
            break;
        }
    }
}

int rt_vsnprintf(char *buf, size_t size, const char *fmt, va_list ap)
{
    struct sink o = { .buf = buf, .cap = size > 0 ? size - 1 : 0, .len = 0,
                      .total = 0, .console = false };
    format(&o, fmt, ap);
    if (size > 0)
        buf[o.len] = '\0';
    return (int)o.total;
}

int rt_snprintf(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = rt_vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return n;
}

int rt_vprintf(const char *fmt, va_list ap)
{
    char buf[256];
    struct sink o = { .buf = buf, .cap = sizeof buf, .len = 0, .total = 0,
                      .console = true };
    format(&o, fmt, ap);
    sink_flush(&o);
    return (int)o.total;
}

int rt_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = rt_vprintf(fmt, ap);
    va_end(ap);
    return n;
}
