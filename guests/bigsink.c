/*
 * bigsink: udpsink with 4 MiB of read-only data that it reads at boot, as
 * large as the text and data of a MirageOS unikernel, for bench/density.py
 * (image sharing: N guests of one image hold one copy of these pages).
 * Arguments, output and exit as udpsink's, after one line
 * "table: N pages read".
 */
#define solo5_app_main udpsink_main
#include "udpsink.c"
#undef solo5_app_main

#define TABLE_BYTES (4 * 1024 * 1024)

static const uint8_t table[TABLE_BYTES] = { [0 ... TABLE_BYTES - 1] = 0x3c };

int solo5_app_main(const struct solo5_start_info *si)
{
    unsigned pages = 0;
    for (unsigned i = 0; i < TABLE_BYTES; i += 4096)
        pages += ((const volatile uint8_t *)table)[i] == 0x3c;
    rt_printf("table: %u pages read\n", pages);
    return udpsink_main(si);
}
