"""PII masking as datatrove's PIIFormatter does it: email addresses and public IP addresses are
replaced by fixed stand-ins, used in turn. The turn restarts with every document (datatrove's
carries over from one document to the next, which would make a document's bytes depend on which
worker saw which documents before it)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import ClassVar

from shardkit.stages.filters.base import I32, RuleFilter

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*"
    r"[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
# example.com/.org are kept as examples; the addresses did not answer pings when datatrove chose them.
EMAIL_STAND_INS = ("email@example.com", "firstname.lastname@example.org")
IP_STAND_INS = ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11",
                "18.104.22.168")


def _public(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_global
    except ValueError:
        return False


@dataclass(frozen=True)
class PII(RuleFilter):
    """Counts and masks email addresses and public IPv4 addresses; never rejects a document."""

    name: ClassVar[str] = "pii"
    decides: ClassVar[bool] = False  # it masks and counts: score() gives the counts, check() is never asked
    emails: bool = True
    ips: bool = True
    only_public_ips: bool = True

    SIGNALS: ClassVar[dict] = {"email": I32, "ip": I32}

    def _ip_ok(self, address: str) -> bool:
        return _public(address) if self.only_public_ips else True

    def _steps(self, text: str):
        yield "email", sum(1 for _ in EMAIL.finditer(text)) if self.emails else 0
        yield "ip", sum(1 for m in IPV4.finditer(text) if self._ip_ok(m.group(0))) if self.ips else 0

    def _rules(self, s: dict):
        return iter(())

    @property
    def verdict(self) -> str | None:
        return None

    @property
    def columns(self) -> dict:
        """pii_email, pii_ip: the counts (the interface's names); no verdict: PII never rejects."""
        return {"pii_email": I32, "pii_ip": I32}

    def edit(self, text: str) -> str:
        if self.emails:
            turn = iter(range(1 << 62))
            text = EMAIL.sub(lambda m: EMAIL_STAND_INS[next(turn) % len(EMAIL_STAND_INS)], text)
        if self.ips:
            turn = iter(range(1 << 62))
            text = IPV4.sub(lambda m: IP_STAND_INS[next(turn) % len(IP_STAND_INS)] if self._ip_ok(m.group(0))
                            else m.group(0), text)
        return text
