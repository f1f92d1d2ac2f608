"""Container networking for pyvmm-oci: a tap wired to a CNI interface.

CNI leaves a container's network namespace with one interface (a veth end,
usually ``eth0``) that has the pod's MAC, IPv4 address and default route.
A unikernel cannot use a veth; it needs a tap. So pyvmm-oci, inside that
namespace:

1. finds the interface (the first non-loopback link with an IPv4 address,
   a veth preferred) and reads its MAC, address, prefix, gateway and MTU;
2. creates a persistent tap (``pvtap`` + a hash of the container id) with
   the same MTU and brings it up;
3. adds an ``ingress`` qdisc to both and a match-everything u32 filter on
   each whose action is ``mirred egress redirect`` to the other: every frame
   arriving on the veth leaves through the tap (to the guest), every frame
   the guest writes leaves through the veth. The kernel's own stack in the
   namespace sees none of them, so the guest owns the interface's MAC and
   IP (it is given both: ``--net-mac`` and the image's argument template).

``teardown`` deletes the tap and the veth's ingress qdisc (with its filter).
Everything goes through pyroute2 with the calling thread moved into the
namespace by setns(2) (pyvmm.host.netns); pyroute2 is imported only here, so a
container without networking needs nothing beyond pyvmm.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import socket

from pyvmm.host.netns import inside_path as inside

ETH_P_ALL = 0x0003
INGRESS = 0xFFFF0000


class NetworkError(Exception):
    """A network set-up the runtime cannot do (one line for the user)."""


class Link:
    """What the guest takes over from the CNI interface, and the tap."""

    __slots__ = ("ifname", "mac", "ip", "prefix", "gateway", "mtu", "tap")

    def __init__(
        self, ifname: str, mac: str, ip: str, prefix: int, gateway: str, mtu: int, tap: str
    ) -> None:
        self.ifname = ifname
        self.mac = mac
        self.ip = ip
        self.prefix = prefix
        self.gateway = gateway
        self.mtu = mtu
        self.tap = tap

    def to_state(self) -> dict[str, str | int]:
        """As state.json keeps it (``Link(**state)`` reads it back)."""
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefix}"

    @property
    def netmask(self) -> str:
        return str(ipaddress.ip_network(self.cidr, strict=False).netmask)

    def values(self) -> dict[str, str]:
        """The names an image's argument template may use."""
        fields = {k: str(v) for k, v in self.to_state().items()}
        fields.update(cidr=self.cidr, netmask=self.netmask)
        return fields


def tap_name(container_id: str) -> str:
    """A tap name (<= 15 bytes) that is the same for the same container."""
    return "pvtap" + hashlib.sha256(container_id.encode()).hexdigest()[:10]


def _find_interface(ipr) -> tuple[dict, str, int]:
    """The CNI interface: (link message, IPv4 address, prefix length)."""
    addrs: dict[int, tuple[str, int]] = {}
    for msg in ipr.get_addr(family=socket.AF_INET):
        addrs.setdefault(msg["index"], (msg.get_attr("IFA_ADDRESS"), msg["prefixlen"]))
    candidates = []
    for link in ipr.get_links():
        name = link.get_attr("IFLA_IFNAME")
        if name == "lo" or name.startswith("pvtap") or link["index"] not in addrs:
            continue
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        candidates.append((kind != "veth", link["index"], link))
    if not candidates:
        raise NetworkError(
            "the container's network namespace has no interface with an IPv4 address "
            "(CNI sets one up)"
        )
    link = min(candidates, key=lambda c: c[:2])[2]
    return (link, *addrs[link["index"]])


def _gateway(ipr, index: int) -> str:
    for route in ipr.get_routes(family=socket.AF_INET):
        if route["dst_len"] == 0 and route.get_attr("RTA_OIF") in (index, None):
            gateway = route.get_attr("RTA_GATEWAY")
            if gateway:
                return gateway
    return ""


def _redirect(ipr, src: int, dst: int) -> None:
    """Every frame arriving on ``src`` leaves through ``dst``."""
    ipr.tc("add", "ingress", src, INGRESS)
    ipr.tc(
        "add-filter",
        "u32",
        src,
        parent=INGRESS,
        protocol=ETH_P_ALL,
        prio=1,
        keys=["0x0/0x0+0"],
        target=0x10001,
        action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": dst},
    )


def setup(netns_path: str, container_id: str) -> Link:
    """Create the tap in the namespace and wire it to the CNI interface."""
    from pyroute2 import IPRoute

    tap = tap_name(container_id)
    with inside(netns_path), IPRoute() as ipr:
        link, ip, prefix = _find_interface(ipr)
        index = link["index"]
        mtu = link.get_attr("IFLA_MTU")
        result = Link(
            ifname=link.get_attr("IFLA_IFNAME"),
            mac=link.get_attr("IFLA_ADDRESS"),
            ip=ip,
            prefix=prefix,
            gateway=_gateway(ipr, index),
            mtu=mtu,
            tap=tap,
        )
        ipr.link("add", ifname=tap, kind="tuntap", mode="tap", ifr={"no_pi": True})
        try:
            tap_index = ipr.link_lookup(ifname=tap)[0]
            ipr.link("set", index=tap_index, mtu=mtu, state="up")
            _redirect(ipr, index, tap_index)
            _redirect(ipr, tap_index, index)
        except BaseException:
            _teardown(ipr, result)
            raise
    return result


def _teardown(ipr, link: Link) -> None:
    for name in (link.ifname,):
        for index in ipr.link_lookup(ifname=name):
            with contextlib.suppress(Exception):
                ipr.tc("del", "ingress", index, INGRESS)
    for index in ipr.link_lookup(ifname=link.tap):
        with contextlib.suppress(Exception):
            ipr.link("del", index=index)


def teardown(netns_path: str, link: dict) -> None:
    """Undo ``setup`` (a namespace that is already gone took it all along)."""
    from pyroute2 import IPRoute

    if not os.path.exists(netns_path):
        return
    try:
        ctx = inside(netns_path)
        ctx.__enter__()
    except OSError:
        return  # not a namespace any more (unmounted): nothing of ours is left
    try:
        with IPRoute() as ipr:
            _teardown(ipr, Link(**link))
    finally:
        ctx.__exit__(None, None, None)
