"""What a tool declaration is: an executable run on a node, the Debian package that provides it,
the argv that prints its version, and whether a node of another architecture runs the board's
own build of it.

The plug-ins declare their tools with it (a VPN driver's `Driver.requires`, a measurement's
`Test.requires`); lab.substrate.tools gathers every declaration into the lists the rest reads:
setup.sh's package list (packages.txt), the packages `lab arch fetch` unpacks, the tools an arch
node runs from its root (lab.core.arch.emulate), the board checks and the run manifest's tool
versions. The commands the lab's own probes and Node helpers run on every node are here too
(NODE_TOOLS), with the few tools several plug-ins share (ip, ping).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    """An executable run on a node, the Debian package that provides it, and the argv that
    prints its version (first line kept in the run manifest; None: nothing worth recording,
    e.g. swanctl, whose --version asks the running charon)."""

    name: str  # as run: a name looked up on PATH, or an absolute path
    package: str
    version: tuple[str, ...] | None = None
    label: str = ""  # key in the manifest's tool_versions (default: the name's basename)
    #: board software under test: a node of another architecture (arch="arm64") runs it from
    #: the board's root under qemu-user, and `lab arch fetch` ships its package; False: node
    #: plumbing, always this machine's binary (docs/arch.md, "Which binary runs")
    board: bool = False

    @property
    def key(self) -> str:
        return self.label or self.name.rsplit("/", 1)[-1]

    @property
    def basename(self) -> str:
        return self.name.rsplit("/", 1)[-1]


#: commands the lab's own probes and Node helpers run on any node (kernelfeatures, Node.
#: missing_tools/children/adopt, mkdir/rm of run files): every driver and test may use them
NODE_TOOLS: tuple[Tool, ...] = (
    Tool("sh", "dash"),
    Tool("cat", "coreutils"),
    Tool("ls", "coreutils"),
    Tool("test", "coreutils"),
    Tool("id", "coreutils"),
    Tool("uname", "coreutils"),
    Tool("mkdir", "coreutils"),
    Tool("rm", "coreutils"),
    Tool("gzip", "gzip"),
    Tool("unshare", "util-linux"),
)
IP = Tool("ip", "iproute2", ("ip", "-V"))
SS = Tool("ss", "iproute2")
# the board's ping: its ICMP timing is part of what a board measures
PING = Tool("ping", "iputils-ping", ("ping", "-V"), board=True)
TC = Tool("tc", "iproute2", ("tc", "-V"))
ETHTOOL = Tool("ethtool", "ethtool", ("ethtool", "--version"))
#: what the lab itself runs on a node besides the plug-ins' tools: links and addresses (ip),
#: impairment (tc), offloads (ethtool)
LAB_TOOLS: tuple[Tool, ...] = (IP, TC, ETHTOOL)
