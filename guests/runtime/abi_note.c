/*
 * The Solo5 ABI note: this is an hvt guest of ABI version 2.  Tenders refuse
 * an executable without it.  Linked into every program as an object (not
 * from the library) so it is always present.
 */
#include "manifest.h"

struct rt_abi_note {
    struct rt_solo5_note_header h;
    uint32_t abi_target;
    uint32_t abi_version;
    uint32_t reserved0;
    uint32_t reserved1;
};
_Static_assert(sizeof(struct rt_abi_note) == 36, "ABI note is 20 + 16 bytes");

__attribute__((section(".note.solo5.abi"), used, aligned(4)))
const struct rt_abi_note solo5_abi_note = {
    .h = {
        .n_namesz = RT_SOLO5_NOTE_NAMESZ,
        .n_descsz = sizeof(struct rt_abi_note) - sizeof(struct rt_solo5_note_header),
        .n_type = SOLO5_NOTE_ABI,
        .n_name = RT_SOLO5_NOTE_NAME,
    },
    .abi_target = HVT_ABI_TARGET,
    .abi_version = HVT_ABI_VERSION,
    .reserved0 = 0,
    .reserved1 = 0,
};
