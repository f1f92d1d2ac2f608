"""Snapshots of a running guest and their restore in a new process.

``format``: the snapshot directory (what is in it, how it is checked);
``vcpu``: the x86_64 vCPU state through KVM's get/set ioctls; ``writer``:
the directory prepared before the sandbox and filled at the trigger;
``restore``: a snapshot checked field by field and resumed
(docs/snapshots.md).
"""
