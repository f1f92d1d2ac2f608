/* hostile.c against Solo5's ring: the same program, a note without shmstream. */
#include "hostile.c"
