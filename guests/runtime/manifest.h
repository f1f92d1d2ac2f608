/*
 * Declaring a program's Solo5 manifest in its own source.
 *
 *     #include "manifest.h"
 *     GUEST_MANIFEST(MFT_NET("service0"), MFT_BLOCK("storage"));
 *
 * emits the `.note.solo5.manifest` ELF note: entry 0 is the reserved-first
 * entry with an empty name, then the listed devices in order, so the first
 * device listed gets handle 1.  `GUEST_MANIFEST();` declares no devices; a
 * program that declares nothing at all gets that empty manifest from the
 * runtime library (default_manifest.c).  Device names are at most 67
 * characters from [A-Za-z0-9]: longer names do not compile.
 * At most one GUEST_MANIFEST per program (the linker checks).
 */
#ifndef RT_MANIFEST_H
#define RT_MANIFEST_H

#include <stdint.h>
#include "hvt_abi.h"

/* An ELF note header with the 8-byte name "Solo5\0\0\0": 20 bytes. */
struct rt_solo5_note_header {
    uint32_t n_namesz;
    uint32_t n_descsz;
    uint32_t n_type;
    char n_name[8];
};
#define RT_SOLO5_NOTE_NAME "Solo5"
#define RT_SOLO5_NOTE_NAMESZ 6

#define MFT_NET(dev_name) { .name = dev_name, .type = MFT_DEV_NET_BASIC }
#define MFT_BLOCK(dev_name) { .name = dev_name, .type = MFT_DEV_BLOCK_BASIC }
/* Where struct mft starts in the note: 20-byte header + 4 bytes padding. */
#define RT_MANIFEST_DESC_OFFSET 24

#define RT_MFT_FIRST_ { .name = "", .type = MFT_RESERVED_FIRST }

/*
 * The note is one struct: header (20 bytes), 4 bytes of padding that the
 * 8-byte alignment of struct mft inserts, struct mft (version, entries) and
 * the entry array that its flexible member e[] names.  n_descsz counts the
 * padding, as Solo5 does: 4 + 8 + 104 * entries.
 */
#define GUEST_MANIFEST(...)                                                  \
    enum {                                                                   \
        rt_mft_entries_ = sizeof((struct mft_entry[]){                       \
                              RT_MFT_FIRST_, __VA_ARGS__ }) /                \
                          sizeof(struct mft_entry)                           \
    };                                                                       \
    struct rt_manifest_note {                                                \
        struct rt_solo5_note_header h;                                       \
        struct mft mft;                                                      \
        struct mft_entry e[rt_mft_entries_];                                 \
    };                                                                       \
    _Static_assert(rt_mft_entries_ <= MFT_MAX_ENTRIES,                       \
                   "too many manifest entries");                             \
    _Static_assert(__builtin_offsetof(struct rt_manifest_note, mft) ==       \
                   RT_MANIFEST_DESC_OFFSET,                                  \
                   "manifest descriptor must be 8-byte aligned");            \
    _Static_assert(__builtin_offsetof(struct rt_manifest_note, e) ==         \
                   RT_MANIFEST_DESC_OFFSET + __builtin_offsetof(struct mft, e), \
                   "manifest entries must follow struct mft");               \
    __attribute__((section(".note.solo5.manifest"), used, aligned(8)))       \
    const struct rt_manifest_note solo5_manifest_note = {                    \
        .h = {                                                               \
            .n_namesz = RT_SOLO5_NOTE_NAMESZ,                                \
            .n_descsz = sizeof(struct rt_manifest_note) -                    \
                        sizeof(struct rt_solo5_note_header),                 \
            .n_type = SOLO5_NOTE_MANIFEST,                                   \
            .n_name = RT_SOLO5_NOTE_NAME,                                    \
        },                                                                   \
        .mft = { .version = MFT_VERSION, .entries = rt_mft_entries_ },       \
        .e = { RT_MFT_FIRST_, __VA_ARGS__ },                                 \
    }

#endif
