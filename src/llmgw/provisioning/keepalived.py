"""keepalived's configuration for a floating address that follows the leader (``server add --vip``).

keepalived runs a check every second: ``/leader`` answers 200 only on the
control plane that leads, so on every other one the check fails, its VRRP
instance goes to FAULT and the address stays on the leader. keepalived itself
is installed and run by the machine's owner; llmgw only writes the file.
"""

from __future__ import annotations

import ipaddress
import zlib

from llmgw.errors import ConfigError

TEMPLATE = """\
# Written by 'llmgw server add --vip'. keepalived keeps {vip} on the control
# plane whose /leader answers 200: the one that holds the leader lease.
vrrp_script llmgw_leader {{
    script "/usr/bin/curl --silent --fail --max-time 2 http://{http}/leader"
    interval 1
    timeout 3
    fall 2
    rise 1
}}

vrrp_instance llmgw_{router_id} {{
    state BACKUP
    interface {interface}
    virtual_router_id {router_id}
    priority 100
    advert_int 1
    virtual_ipaddress {{
        {vip}
    }}
    track_script {{
        llmgw_leader
    }}
}}
"""


def keepalived_config(vip: str, http_address: str, interface: str = "eth0") -> str:
    """The configuration for one control plane; ``http_address`` is host:port of its /leader."""
    try:
        address = ipaddress.ip_interface(vip if "/" in vip else f"{vip}/32")
    except ValueError:
        raise ConfigError(f"--vip {vip!r} is not an IP address", hint="give one like 10.0.0.100") from None
    router_id = 1 + zlib.crc32(str(address.ip).encode()) % 254
    return TEMPLATE.format(
        vip=address.with_prefixlen, http=http_address, interface=interface, router_id=router_id
    )
