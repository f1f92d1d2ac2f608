"""Why this user cannot open /dev/kvm, and what would let it.

"Join the group that owns it" is the answer only where the group may open
the device: a root:root 0600 /dev/kvm (a distribution without a kvm group,
a container's device node) opens for root alone, and joining root's group
would not help. The advice is read from the device node itself.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from collections.abc import Callable

#: Read and write for the group, for others.
_GROUP_RW = stat.S_IRGRP | stat.S_IWGRP
_OTHER_RW = stat.S_IROTH | stat.S_IWOTH

#: The udev rule most distributions ship for a kvm group.
UDEV_RULE = 'KERNEL=="kvm", GROUP="kvm", MODE="0660"'


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _listed_members(gid: int) -> list[str]:
    import grp

    try:
        return list(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return []


def advice(
    path: str,
    *,
    st: os.stat_result | None = None,
    groups: list[int] | None = None,
    user: str | None = None,
    group_name: Callable[[int], str] = _group_name,
    members: Callable[[int], list[str]] = _listed_members,
) -> str:
    """What stands in the way and what to do, for the EACCES of ``path``
    (the keyword arguments stand for the host's facts, in tests)."""
    try:
        st = st or os.stat(path)
    except OSError:
        return "run as root"
    groups = os.getgroups() + [os.getegid()] if groups is None else groups
    user = user or _user_name()
    mode = stat.S_IMODE(st.st_mode)
    owner = f"{'root' if st.st_uid == 0 else st.st_uid}:{group_name(st.st_gid)}"
    shown = f"{path} is {owner}, mode {mode:04o}"
    if mode & _GROUP_RW == _GROUP_RW and st.st_gid != 0:
        group = group_name(st.st_gid)
        if st.st_gid in groups:
            return (
                f"{shown} and {user} is in group {group}, yet the open was refused "
                "(an ACL, a security module or a container's device rules decide)"
            )
        if user in members(st.st_gid):
            return (
                f"{shown}: {user} was added to group {group} after this session "
                "started: log in again (or run newgrp " + group + ")"
            )
        return (
            f"{shown}: join group {group} (usermod -aG {group} {user}, then log in again) "
            "or run as root"
        )
    if mode & _OTHER_RW == _OTHER_RW:
        return (
            f"{shown}, open to everyone, yet the open was refused "
            "(an ACL, a security module or a container's device rules decide)"
        )
    who = "root" if st.st_uid == 0 else "its owner"
    if mode & _GROUP_RW == _GROUP_RW:
        who += f" and group {group_name(st.st_gid)}"
    return (
        f"{shown}: only {who} may open it: run as root, "
        f"or give it a kvm group (groupadd -r kvm; a udev rule {UDEV_RULE} in "
        "/etc/udev/rules.d/; udevadm trigger) and join that group"
    )
