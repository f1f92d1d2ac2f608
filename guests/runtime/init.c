/*
 * C entry: check what the tender handed over, set up clocks and heap, run
 * the program.  Also the manifest lookups the device code shares.
 */
#include "rt_internal.h"

/* The program's own manifest note (manifest.h), whose size only the
 * program knows: seen here as bytes, struct mft at RT_MANIFEST_DESC_OFFSET.
 * A program built with Solo5's toolchain has the note solo5-elftool
 * generates, with the same layout under Solo5's name. */
#ifdef RT_SOLO5_BINDINGS
#define solo5_manifest_note __solo5_mft1_note
#endif
extern const char solo5_manifest_note[];

extern char _end[]; /* linker script: end of .bss, page aligned */

static const struct hvt_boot_info *boot_info;
static const struct mft *host_mft;
static uint64_t acquired; /* bit i: handle i was acquired */
static struct solo5_start_info start_info;

static void __attribute__((noreturn)) init_fail(const char *what)
{
    rt_printf("pyvmm-rt: bad start-up state: %s\n", what);
    rt_halt(SOLO5_EXIT_ABORT, NULL);
}

/* Entry names are untrusted host data: compare within the field only. */
static bool name_is(const struct mft_entry *e, const char *name)
{
    size_t len = strnlen(name, MFT_NAME_SIZE);
    return len < MFT_NAME_SIZE && memcmp(e->name, name, len + 1) == 0;
}

/*
 * The host copies our manifest note into guest memory and fills in the
 * device facts; check that the copy still describes the same devices.
 */
static void check_manifest(const struct mft *m)
{
    const struct mft *ours =
        (const struct mft *)(solo5_manifest_note + RT_MANIFEST_DESC_OFFSET);

    if (m == NULL)
        init_fail("boot info has no manifest");
    if (m->version != MFT_VERSION)
        init_fail("manifest version is not 1");
    if (m->entries < 1 || m->entries > MFT_MAX_ENTRIES)
        init_fail("manifest entry count out of range");
    if (m->entries != ours->entries)
        init_fail("manifest entry count differs from the ELF note");
    for (uint32_t i = 0; i < m->entries; i++) {
        if (m->e[i].type != ours->e[i].type || !name_is(&m->e[i], ours->e[i].name))
            init_fail("manifest entry differs from the ELF note");
    }
    if (m->e[0].type != MFT_RESERVED_FIRST)
        init_fail("manifest entry 0 is not reserved-first");
}

void rt_init(const struct hvt_boot_info *bi)
{
#ifdef RT_SOLO5_BINDINGS
    rt_solo5_start();
#endif
    boot_info = bi;
    rt_platform_setup(bi);
    rt_clock_init(bi);

    host_mft = (const struct mft *)(uintptr_t)bi->mft;
    check_manifest(host_mft);

    start_info.cmdline = bi->cmdline ? (const char *)(uintptr_t)bi->cmdline : "";
#ifdef RT_SOLO5_BINDINGS
    start_info.cmdline = rt_solo5_cmdline(start_info.cmdline);
#endif

    /* The tender's kernel_end may leave out a .bss-only segment (loaders
     * skip PT_LOADs without file contents), so also use our own _end. */
    uintptr_t heap_start = (uintptr_t)_end;
    if (bi->kernel_end > heap_start)
        heap_start = bi->kernel_end;
    heap_start = (heap_start + 4095) & ~(uintptr_t)4095;
    if (heap_start >= bi->mem_size)
        init_fail("no guest memory left after the program");
#ifdef RT_SOLO5_BINDINGS
    /* The program owns its whole heap: the runtime's comes first. */
    uintptr_t rt_heap = heap_start;
    heap_start = (heap_start + rt_solo5_runtime_heap(host_mft) + 4095) &
                 ~(uintptr_t)4095;
    if (heap_start >= bi->mem_size)
        init_fail("no guest memory left after the program");
    rt_heap_init(rt_heap, heap_start);
    start_info.heap_start = heap_start;
    start_info.heap_size = bi->mem_size - heap_start;
#else
    start_info.heap_start = heap_start;
    start_info.heap_size = bi->mem_size - heap_start;
    /* rt_alloc leaves the top of the heap to the stack; with very little
     * memory it simply has nothing to give. */
    if (start_info.heap_size > RT_STACK_RESERVE)
        rt_heap_init(heap_start, bi->mem_size - RT_STACK_RESERVE);
    else
        rt_heap_init(heap_start, heap_start);
#endif

    solo5_exit(solo5_app_main(&start_info));
}

const struct hvt_boot_info *rt_boot_info(void)
{
    return boot_info;
}

const struct mft *rt_manifest(void)
{
    return host_mft;
}

const struct mft_entry *rt_mft_entry(solo5_handle_t handle, uint32_t type)
{
    if (handle >= host_mft->entries)
        return NULL;
    const struct mft_entry *e = &host_mft->e[handle];
    if (e->type != type || !e->attached)
        return NULL;
    return e;
}

solo5_result_t rt_mft_acquire(const char *name, uint32_t type,
        solo5_handle_t *handle, const struct mft_entry **entry)
{
    for (uint32_t i = 1; i < host_mft->entries; i++) {
        const struct mft_entry *e = &host_mft->e[i];
        if (e->type != type || !name_is(e, name))
            continue;
        if (!e->attached || (acquired & (1ULL << i)))
            return SOLO5_R_EINVAL;
        acquired |= 1ULL << i;
        *handle = i;
        *entry = e;
        return SOLO5_R_OK;
    }
    return SOLO5_R_EINVAL;
}
