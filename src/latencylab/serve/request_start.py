"""``X-Request-Start``: when a request entered the system, so that its deadline counts the time before the handler.

A server's own clock starts when its handler runs, but a user's wait starts earlier: in the router, in the
socket's accept and receive queues, behind a busy event loop. Routers and load generators stamp the start
time in this de-facto standard header, as unix time in one of three units:

* ``t=1700000000.123`` -- seconds with a fraction (NGINX ``proxy_set_header X-Request-Start "t=${msec}"``);
* ``t=1700000000123``  -- milliseconds (Heroku's router);
* ``t=1700000000123456`` -- microseconds (``latencylab load --request-start-header``; New Relic reads all three).

The ``t=`` prefix is optional. The unit is told apart by magnitude: a unix time in seconds stays below 1e11
until the year 5138, in milliseconds below 1e14, in microseconds below 1e17. A stamp more than
``MAX_AHEAD_NS`` in the future or more than ``MAX_AGE_NS`` old is refused (it is a wrong unit, a wrong clock,
or a replay, and trusting it would shed or admit the request for no reason); a stamp up to ``MAX_AHEAD_NS`` in
the future is small clock skew between the stamper and this host, and counts as age 0.
"""

from __future__ import annotations

import re

from latencylab.serve.types import ProtocolError

HEADER = "X-Request-Start"
MAX_AGE_NS = 3600 * 10**9  # 1 h
MAX_AHEAD_NS = 10**9  # 1 s of clock skew

_STAMP = re.compile(r"(?:[tT]=)?([0-9]{1,20})(?:\.([0-9]{1,9}))?")  # [0-9], not \d: no other script's digits
# (upper bound of the integer part, ns per unit), by magnitude
_UNITS = ((10**11, 10**9), (10**14, 10**6), (10**17, 10**3))


def parse_unix_ns(text: str) -> int:
    """The unix time in ns that a header value states; raises ProtocolError (400) naming the header."""
    m = _STAMP.fullmatch(text.strip())
    if m is None:
        raise ProtocolError(
            f"header {HEADER} must be t=<unix time in s (with a fraction), ms or µs>, got {text[:40]!r}"
        )
    whole, frac = int(m.group(1)), m.group(2) or ""
    for bound, ns_per_unit in _UNITS:
        if whole < bound:
            return whole * ns_per_unit + (int(frac) * ns_per_unit // 10 ** len(frac) if frac else 0)
    raise ProtocolError(f"header {HEADER}: {text[:40]!r} is too large for a unix time in s, ms or µs")


def request_age_ns(text: str, now_unix_ns: int) -> int:
    """How long (ns, >= 0) before ``now_unix_ns`` the request started, from its ``X-Request-Start`` value.

    Raises ProtocolError (400) for a value that is not a time, or is absurd: more than 1 h old or more than
    1 s in the future. Skew within 1 s ahead of this host's clock is clamped to age 0."""
    age = now_unix_ns - parse_unix_ns(text)
    if age > MAX_AGE_NS:
        raise ProtocolError(
            f"header {HEADER}: {text[:40]!r} is {age / 1e9:.0f} s old (more than {MAX_AGE_NS // 10**9} s): "
            "not a unix time in s, ms or µs, or the client's clock is wrong"
        )
    if age < -MAX_AHEAD_NS:
        raise ProtocolError(
            f"header {HEADER}: {text[:40]!r} is {-age / 1e9:.3f} s in the future (more than "
            f"{MAX_AHEAD_NS / 1e9:g} s of clock skew)"
        )
    return max(0, age)
