/*
 * pyvmm's capability note: this guest runs correctly at privilege level 3
 * (user mode), so pyvmm may start it there (natively fast on kvm_pvm hosts,
 * where CPL 0 code is emulated), and it has a shmstream driver (net_shm.c),
 * so pyvmm may serve its net devices through shared-memory rings instead of
 * a hypercall per frame (a program without net devices gets no region; one
 * that gets none, e.g. under --shm=off or stock solo5-hvt, uses the
 * hypercalls).  Owner "pyvmm" (namesz 6, padded to 8),
 * type PYVMM_NOTE_CAPS, descriptor struct pyvmm_caps right after the 20-byte
 * header.  Stock solo5-hvt ignores notes it does not know.  Linked into every
 * program as an object (not from the library), like the ABI note.
 *
 * What makes the claims true: the runtime uses only unprivileged instructions
 * except where guarded by rt_cpl() == 0 (tls.c: wrmsr for the TLS base); and
 * net.c picks the shmstream back end for every acquired net device that the
 * (validated) region lists, the hypercall back end otherwise.
 */
#include "manifest.h"
#include "pyvmm_abi.h"

/* Programs that must not ask for shmstream (s5ring, which exercises
 * Solo5's own ring) are linked with a copy built with RT_CAPS_FLAGS set. */
#ifndef RT_CAPS_FLAGS
#define RT_CAPS_FLAGS (PYVMM_CAP_USER_MODE | PYVMM_CAP_SHMSTREAM)
#endif

#define RT_PYVMM_NOTE_NAME "pyvmm"
#define RT_PYVMM_NOTE_NAMESZ 6

/* The header layout is the same as the Solo5 notes': an 8-byte name. */
struct rt_caps_note {
    struct rt_solo5_note_header h;
    struct pyvmm_caps caps;
};
_Static_assert(sizeof(RT_PYVMM_NOTE_NAME) == RT_PYVMM_NOTE_NAMESZ,
               "namesz counts the terminating NUL");
_Static_assert(__builtin_offsetof(struct rt_caps_note, caps) == 20,
               "descriptor follows the 20-byte header");
_Static_assert(sizeof(struct rt_caps_note) == 28, "caps note is 20 + 8 bytes");

__attribute__((section(".note.pyvmm.caps"), used, aligned(4)))
const struct rt_caps_note pyvmm_caps_note = {
    .h = {
        .n_namesz = RT_PYVMM_NOTE_NAMESZ,
        .n_descsz = sizeof(struct pyvmm_caps),
        .n_type = PYVMM_NOTE_CAPS,
        .n_name = RT_PYVMM_NOTE_NAME,
    },
    .caps = {
        .version = PYVMM_CAPS_VERSION,
        .flags = RT_CAPS_FLAGS,
    },
};
