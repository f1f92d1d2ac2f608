/*
 * The manifest of a program that declares none: no devices.  This object is
 * in the runtime library, so the linker takes it only when no program object
 * defines solo5_manifest_note (init.c refers to it).
 */
#include "manifest.h"

GUEST_MANIFEST();
