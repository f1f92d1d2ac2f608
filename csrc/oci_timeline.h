/*
 * A container's start-up timeline, the native front end's part
 * (pyvmm/oci/timeline.py is the module; the file formats are its).
 *
 * ROOT/ID/timeline exists only when the container's timeline was asked
 * for at create: every call appends its span to it (one Trace Event per
 * line, CLOCK_MONOTONIC in us), and delete merges it with the VM's own
 * phases (ROOT/ID/vm-trace.json, pyvmm --trace, CLOCK_BOOTTIME) into the
 * destination its header names. A container without it costs a call one
 * failed open.
 */
#ifndef PYVMM_OCI_TIMELINE_H
#define PYVMM_OCI_TIMELINE_H

#include <time.h>

/* Where the native front end hands a call to Python: the call's begin (ns). */
#define OCI_TIMELINE_BEGIN_ENV "PYVMM_OCI_T0"

/* CLOCK_MONOTONIC now, in ns. */
long long oci_timeline_now(void);

/* The span of call `name` from begin_ns until now, with its exit status,
 * if the container in `dir` keeps a timeline. */
void oci_timeline_span(const char *dir, const char *name, long long begin_ns, int status);

/* delete: the span of the call, then the container's merged timeline
 * written (owner-only, under a fresh name renamed over the destination).
 * Before the state directory goes. Nothing without a timeline. */
void oci_timeline_finish(const char *dir, long long begin_ns);

#endif
