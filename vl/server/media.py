"""Media references of an OpenAI-shaped request -> bytes or a local path the processor may open.

The policy (docs/server.md, "Security"): `data:` URIs are decoded after their size is checked on the base64
text; `file://` paths are opened only under `--allowed-root` folders (symlinks resolved first); http(s) URLs
are refused unless the server was started with `--allow-fetch`, and then fetched with a byte cap (checked on
Content-Length and again while reading, as TGI's `fetch_image` does), a time cap, no redirects, and never
from a loopback, private, link-local or otherwise non-public address unless `--allow-private-fetch` (the
SSRF lessons of vLLM's media connector and lmdeploy, which re-validate every hop). An IPv6 address that carries
an IPv4 address (IPv4-mapped and -compatible, NAT64, 6to4, Teredo) is judged by that IPv4 address too, since it
reaches it. Everything else in the bytes (format sniffing, pixel and frame caps) is the processor's job, behind
the same `MediaLimits`.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from vl.errors import (
    InputError,
    MediaFetchError,
    MediaTooLargeError,
    MediaURLRefusedError,
    RemoteMediaError,
)
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits

_DATA_URI = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


@dataclass(frozen=True)
class MediaPolicy:
    limits: MediaLimits = DEFAULT_LIMITS
    allowed_roots: tuple[Path, ...] = ()  # file:// only below these (resolved) folders
    allow_fetch: bool = False
    allow_private_fetch: bool = False  # fetch from loopback / private addresses too (a trusted network only)
    fetch_timeout_s: float = 10.0
    fetch_max_bytes: int | None = None  # None: the kind's byte cap from `limits`
    roots: tuple[Path, ...] = field(init=False, default=())

    def __post_init__(self):
        object.__setattr__(self, "roots", tuple(Path(r).resolve() for r in self.allowed_roots))

    def max_bytes(self, kind: str) -> int:
        cap = {"image": self.limits.max_image_bytes, "video": self.limits.max_video_bytes,
               "pdf": self.limits.max_pdf_bytes, "audio": self.limits.max_audio_bytes}[kind]
        return cap if self.fetch_max_bytes is None else min(cap, self.fetch_max_bytes)


def resolve(url, kind: str, policy: MediaPolicy):
    """A media reference (`data:` URI, `file://` URL, http(s) URL) -> bytes or a local path string."""
    if not isinstance(url, str) or not url:
        raise InputError(f"expected the {kind} as a non-empty URL string (data:, file:// or http(s)://), "
                         f"found {type(url).__name__}")
    scheme = url[:16].split(":", 1)[0].lower() if ":" in url[:16] else ""
    if scheme == "data":
        return decode_data_uri(url, kind, policy.max_bytes(kind))
    if scheme == "file":
        return _local_path(url, kind, policy)
    if scheme in ("http", "https"):
        if not policy.allow_fetch:
            raise MediaURLRefusedError(f"the {kind} is an {scheme} URL ({url[:60]!r}); this server does not fetch "
                                       "URLs. Send the bytes as a data: URI (data:<mime>;base64,...), or start the "
                                       "server with --allow-fetch")
        return fetch(url, kind, policy)
    raise InputError(f"the {kind} URL must start with data:, file:// or http(s)://, found {url[:40]!r}")


def decode_data_uri(url: str, kind: str, max_bytes: int) -> bytes:
    m = _DATA_URI.match(url)
    if m is None or not m.group("b64"):
        raise InputError(f"the {kind} data URI must look like data:<mime>;base64,<data>, found {url[:40]!r}")
    return decode_base64(url[m.end():], kind, max_bytes, f"the {kind} data URI")


def decode_base64(payload: str, kind: str, max_bytes: int, what: str) -> bytes:
    """Standard base64 text -> bytes, its size checked on the text before anything is decoded. `what` names the
    text in the message ("the audio data URI", "input_audio.data")."""
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise MediaTooLargeError(f"the {kind} is about {len(payload) // 4 * 3} bytes; this server accepts at most "
                                 f"{max_bytes} bytes per {kind}")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{what} is not valid base64; encode the file with standard base64 "
                         "(A-Z a-z 0-9 + /, padded with =)") from None
    if len(data) > max_bytes:
        raise MediaTooLargeError(f"the {kind} is {len(data)} bytes; this server accepts at most {max_bytes}")
    return data


def _local_path(url: str, kind: str, policy: MediaPolicy) -> str:
    if not policy.roots:
        raise RemoteMediaError(f"file:// {kind} paths are refused: this server was started without --allowed-root. "
                               "Send the bytes as a data: URI")
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise RemoteMediaError(f"file:// URLs name a local path (file:///abs/path), found host {parsed.netloc!r}")
    name = urllib.parse.unquote(parsed.path)
    if "\x00" in name:
        raise InputError(f"the {kind} file:// path holds a NUL byte (%00), which no file name can; send the path "
                         "without it")
    path = Path(name).resolve()  # symlinks and .. resolved before the check
    if not any(path.is_relative_to(root) for root in policy.roots):
        raise RemoteMediaError(f"the {kind} path is outside this server's allowed media folders")
    if not path.is_file():
        raise InputError(f"the {kind} file {parsed.path!r} does not exist under the allowed media folders")
    return str(path)


def _check_address(host: str, policy: MediaPolicy) -> None:
    if policy.allow_private_fetch:
        return
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise MediaFetchError(f"cannot resolve {host!r}: {e}") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if not all(a.is_global and not a.is_multicast for a in (ip, *embedded_ipv4(ip))):
            raise MediaFetchError(f"{host!r} resolves to a non-public address; this server only fetches from "
                                  "public addresses (start it with --allow-private-fetch on a trusted network)")


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix: the IPv4 address is the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use prefixes: never a public address
_TEREDO = ipaddress.ip_network("2001::/32")


def embedded_ipv4(ip) -> list:
    """The IPv4 addresses an IPv6 address reaches or stands for: IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible
    (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 (2002:AABB:CCDD::, bits 16-48) and Teredo (2001::/32, the client
    address inverted in the last 32 bits). A local-use NAT64 address stands for 0.0.0.0 (never public)."""
    if ip.version != 6:
        return []
    out = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip.packed[:12] == bytes(12) and int(ip) > 1:  # IPv4-compatible; :: and ::1 are judged as they are
        out.append(ipaddress.IPv4Address(ip.packed[12:]))
    if ip in _NAT64:
        out.append(ipaddress.IPv4Address(ip.packed[12:]))
    if ip in _NAT64_LOCAL:
        out.append(ipaddress.IPv4Address(0))
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip in _TEREDO and ip.teredo is not None:
        out.append(ip.teredo[1])
    return out


def fetch(url: str, kind: str, policy: MediaPolicy) -> bytes:
    import httpx

    try:
        parsed = urllib.parse.urlparse(url)
        parsed.port  # noqa: B018 - a bad port raises here, not inside the client
    except ValueError as e:
        raise InputError(f"the {kind} URL is malformed ({e}): {url[:60]!r}") from None
    if not parsed.hostname:
        raise MediaFetchError(f"the {kind} URL has no host: {url[:60]!r}")
    _check_address(parsed.hostname, policy)
    cap = policy.max_bytes(kind)
    try:
        with httpx.Client(timeout=policy.fetch_timeout_s, follow_redirects=False, trust_env=False) as client:
            with client.stream("GET", url) as r:
                if r.is_redirect:
                    raise MediaFetchError(f"fetching the {kind} got a redirect ({r.status_code}); redirects are not "
                                          "followed, give the final URL")
                if r.status_code != 200:
                    raise MediaFetchError(f"fetching the {kind} got HTTP {r.status_code}")
                length = r.headers.get("content-length")
                if length is not None and length.isdigit() and int(length) > cap:
                    raise MediaTooLargeError(f"the {kind} at that URL is {length} bytes; at most {cap} are fetched")
                data, deadline = bytearray(), time.monotonic() + policy.fetch_timeout_s
                for chunk in r.iter_bytes():
                    data += chunk
                    if time.monotonic() > deadline:  # httpx's timeouts are per read; this one is for the whole
                        raise httpx.ReadTimeout("total time cap")
                    if len(data) > cap:
                        raise MediaTooLargeError(f"the {kind} at that URL is larger than {cap} bytes, the fetch cap")
                return bytes(data)
    except httpx.TimeoutException:
        raise MediaFetchError(f"fetching the {kind} took longer than {policy.fetch_timeout_s:g} s") from None
    except httpx.HTTPError as e:
        raise MediaFetchError(f"fetching the {kind} failed: {type(e).__name__}") from None
