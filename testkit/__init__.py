"""The test and benchmark kit: everything the tests, bench/ and scripts/demo
use that pyvmm itself does not ship.

    testkit.native   the test-only cffi extension (testkit/csrc): the shared
                     ring operations of csrc/shmstream_ring.h exported as
                     functions, the two-thread ring stress, the UDP sender;
                     built by scripts/setup (python3 -m testkit.build), and
                     rebuilt on import when a source is newer than the build
    testkit.guestnet the guest's shmstream driver (guests/runtime/net_shm.c,
                     unchanged) built for the host with test doubles
                     (testkit/guestrt), the test playing a broken host;
                     built with testkit.native, rebuilt on import when an
                     input's content changed
    testkit.iorig    the one rig around the native IO thread: its eventfds,
                     socketpair taps, guard areas, a shmstream link or
                     Solo5's ring served a pass at a time or threaded
    testkit.netns    throw-away network namespaces with taps
    testkit.containerd  a private containerd (its own directories, socket
                     and config) and ctr against it, taken down whatever
                     state it is left in
    testkit.traffic  the C UDP traffic generator (python -m testkit.traffic)
    testkit.helpers  what several tests need: frame patterns, the stats-line
                     parser, the ping invocation, ABI patching, constants

Import it with the repository root on sys.path (pytest's configuration,
bench/*.py and scripts/demo.py put it there).
"""
