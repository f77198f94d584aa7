"""The kernel side of manual-key IPsec (XFRM): what the kernel needs for each protocol and
algorithm (kernel_missing, read-only through lab.vpn.kernelfeatures), and the SAs and policies it
holds as `ip xfrm` shows them (sa_counters, policy_selectors).
"""

from __future__ import annotations

import re

from lab.core.node import Node
from lab.vpn.kernelfeatures import missing_features

#: what the kernel needs, per feature: (label, CONFIG_ symbols (any), module names (any))
_KERNEL = {
    "ah": [
        ("ah4", ("CONFIG_INET_AH",), ("ah4",)),
        ("ah6", ("CONFIG_INET6_AH",), ("ah6",)),
    ],
    "esp": [
        ("esp4", ("CONFIG_INET_ESP",), ("esp4",)),
        ("esp6", ("CONFIG_INET6_ESP",), ("esp6",)),
        ("authenc", ("CONFIG_CRYPTO_AUTHENC",), ("authenc",)),
        ("echainiv", ("CONFIG_CRYPTO_ECHAINIV",), ("echainiv",)),
        ("cbc", ("CONFIG_CRYPTO_CBC",), ("cbc",)),
    ],
    "hmac": [("hmac", ("CONFIG_CRYPTO_HMAC",), ("hmac",))],
    "hmac(sha1)": [
        ("sha1", ("CONFIG_CRYPTO_SHA1", "CONFIG_CRYPTO_SHA1_SSSE3"), ("sha1_generic", "sha1_ssse3"))
    ],
    "hmac(md5)": [("md5", ("CONFIG_CRYPTO_MD5",), ("md5",))],
    "hmac(sha256)": [
        (
            "sha256",
            ("CONFIG_CRYPTO_SHA256", "CONFIG_CRYPTO_SHA256_SSSE3"),
            ("sha256_generic", "sha256_ssse3"),
        )
    ],
    "cbc(des3_ede)": [
        (
            "des3_ede",
            ("CONFIG_CRYPTO_DES", "CONFIG_CRYPTO_DES3_EDE_X86_64"),
            ("des_generic", "des3_ede_x86_64"),
        )
    ],
    "cbc(aes)": [
        ("aes", ("CONFIG_CRYPTO_AES", "CONFIG_CRYPTO_AES_NI_INTEL"), ("aes_generic", "aesni_intel"))
    ],
    "digest_null": [("crypto_null", ("CONFIG_CRYPTO_NULL",), ("crypto_null",))],
}


def kernel_missing(node: Node, needs: list[str]) -> list[str]:
    """Of the _KERNEL features `needs`, what the node's kernel lacks ("label (CONFIG_X)");
    read-only."""
    features = [f for need in needs for f in _KERNEL[need]]
    return [f"{label} ({symbols[0]})" for label, symbols, _ in missing_features(node, features)]


_STATE_HEAD = re.compile(r"^src (\S+) dst (\S+)\n\s+proto (\w+) spi (0x[0-9a-f]+)", re.MULTILINE)
_CURRENT = re.compile(r"lifetime current:\n\s+(\d+)\(bytes\), (\d+)\(packets\)")


def sa_counters(node) -> dict[tuple[str, str, str], tuple[int, int]]:
    """{(dst, proto, spi): (bytes, packets)} of the node's SAs, from `ip -s xfrm state list`.

    Text, not JSON: iproute2's xfrm commands have no -j output (6.1). The output also shows
    the keys: it is parsed here and never stored.
    """
    out = node.run(["ip", "-s", "xfrm", "state", "list"], check=False).stdout
    found = {}
    heads = list(_STATE_HEAD.finditer(out))
    for i, m in enumerate(heads):
        block = out[m.start() : heads[i + 1].start() if i + 1 < len(heads) else len(out)]
        c = _CURRENT.search(block)
        if c:
            found[(m[2], m[3], m[4])] = (int(c[1]), int(c[2]))
    return found


_POLICY = re.compile(
    r"^src (\S+) dst (\S+)(?:[^\n]*? type (\d+))?[^\n]*\n\s*dir (\w+)", re.MULTILINE
)


def policy_selectors(node) -> set[tuple[str, str, str | None, str]]:
    """{(src, dst, ICMP type or None, dir)} of the node's policies (`ip xfrm policy list`)."""
    out = node.run(["ip", "xfrm", "policy", "list"], check=False).stdout
    return {(m[1], m[2], m[3], m[4]) for m in _POLICY.finditer(out)}
