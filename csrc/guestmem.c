/* See guestmem.h: the one checked accessor of guest memory. */
#include <stddef.h>

#include "guestmem.h"
#include "hvt_abi.h"

_Static_assert(PYVMM_LOW_AREA_END == HVT_GUEST_MIN_BASE,
               "the low area ends where the guest image may start");

void *pyvmm_guestmem_at(const struct pyvmm_guestmem *m, uint64_t gpa, uint64_t len,
                        int access)
{
    uint64_t i;

    if (!m->host || gpa > m->size || len > m->size - gpa)
        return NULL;
    if (access == PYVMM_GM_READ || len == 0)
        return (void *)(uintptr_t)(m->host + gpa);
    /* Any access but the host's own set-up is a write on the guest's behalf. */
    if (access != PYVMM_GM_SETUP && gpa < m->low_end)
        return NULL;
    for (i = 0; i < m->n_ro; i++)
        if (gpa < m->ro[2 * i + 1] && m->ro[2 * i] < gpa + len)
            return NULL;
    return (void *)(uintptr_t)(m->host + gpa);
}
