"""How a lookup's answer is judged, record by record: ``verified`` only for
what a receiver would use (RFC 7208 for SPF, RFC 6376 §3.6.1 for the DKIM key
record, RFC 7489 for DMARC), and the length of a sending domain's name."""

from __future__ import annotations

import uuid

import pytest

from tidings.email import dkim
from tidings.email.names import MAX_SENDING_LENGTH, domain_name, sending_domain_name
from tidings.email.records import Record, Status, judge, records_for, return_path_host

HOST = "mx.tidings.example"
KEY = "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6"
SPF = Record("TXT", "bounces.example.com", f"v=spf1 a:{HOST} ~all", "spf")
DKIM = Record("TXT", "s._domainkey.example.com", f"v=DKIM1; k=rsa; p={KEY}", "dkim")
DMARC = Record("TXT", "_dmarc.example.com", "v=DMARC1; p=none;", "dmarc")


@pytest.mark.parametrize(("answers", "status"), [
    ([f"v=spf1 a:{HOST} ~all"], "verified"),
    ([f"V=SPF1 +A:{HOST.upper()} -ALL"], "verified"),
    (["site-verify=1", f"v=spf1 include:_spf.google.com a:{HOST} -all"], "verified"),
    ([f"v=spf1 a:{HOST}"], "verified"),
    ([f"v=spf1  a:{HOST}  redirect=_spf.example.com "], "verified"),
    # A receiver takes the host with a trailing dot as the same host.
    ([f"v=spf1 a:{HOST}. ~all"], "verified"),
    # Not SPF records at all: the version is exactly v=spf1, then a space or the end.
    ([f"v=spf10 a:{HOST} ~all"], "missing"),
    ([f"v=spf1a:{HOST} ~all"], "missing"),
    (["site-verify=1"], "missing"),
    ([], "missing"),
    # Two SPF records are a permerror.
    ([f"v=spf1 a:{HOST} ~all", "v=spf1 -all"], "mismatch"),
    ([f"v=spf1 a:{HOST} ~all", f"v=spf1 a:{HOST} ~all "], "mismatch"),
    # Nothing after all is evaluated.
    ([f"v=spf1 -all a:{HOST}"], "mismatch"),
    ([f"v=spf1 include:_spf.google.com ~all +a:{HOST}"], "mismatch"),
    # Qualifiers other than pass, other hosts, and syntax errors anywhere.
    ([f"v=spf1 -a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 ~a:{HOST} ~all"], "mismatch"),
    (["v=spf1 a:mx.elsewhere.example ~all"], "mismatch"),
    ([f"v=spf1 a:{HOST} ~all include"], "mismatch"),
    ([f"v=spf1 a:{HOST} redirect=a.example redirect=b.example"], "mismatch"),
    # The first mechanism that matches the mail host decides (RFC 7208 §4.6.2):
    # the MX of the record's own name is the mail host (the return-path record).
    ([f"v=spf1 -mx a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 ~mx a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 ?mx/24 a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 -mx:bounces.example.com. a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 -a:{HOST} a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 ~a:{HOST}/24 +a:{HOST} ~all"], "mismatch"),
    ([f"v=spf1 a:{HOST} -mx ~all"], "verified"),
    ([f"v=spf1 a:{HOST}/24 ~all"], "verified"),
    # A passing mx is passed over (the return-path record is not required);
    # mechanisms about other names or addresses do not tell about the mail host.
    (["v=spf1 mx ~all"], "mismatch"),
    ([f"v=spf1 mx -mx:mx.elsewhere.example -a -ip4:192.0.2.1 -ip6:2001:db8::/32 a:{HOST}"],
     "verified"),
])
def test_spf(answers: list[str], status: Status) -> None:
    assert judge(SPF, answers) == status


@pytest.mark.parametrize(("answers", "status"), [
    ([f"v=DKIM1; k=rsa; p={KEY}"], "verified"),
    ([f"p={KEY}"], "verified"),
    ([f" v = DKIM1 ;k=rsa;\tp = {KEY[:30]}\r\n {KEY[30:]} ;"], "verified"),
    ([f"v=DKIM1; h=sha1:sha256; s=email:tlsrpt; t=y; p={KEY}"], "verified"),
    ([f"v=DKIM1; s=*; p={KEY}"], "verified"),
    # Another key, a revoked key, no key.
    ([f"v=DKIM1; k=rsa; p={KEY[:-4]}AAAA"], "mismatch"),
    (["v=DKIM1; k=rsa; p="], "mismatch"),
    (["v=DKIM1; k=rsa"], "mismatch"),
    # Records a receiver discards or cannot verify our rsa-sha256 signatures with.
    ([f"v=DKIM2; k=rsa; p={KEY}"], "mismatch"),
    ([f"v=dkim1; k=rsa; p={KEY}"], "mismatch"),
    ([f"k=rsa; v=DKIM1; p={KEY}"], "mismatch"),
    ([f"v=DKIM1; k=ed25519; p={KEY}"], "mismatch"),
    ([f"v=DKIM1; k=RSA; p={KEY}"], "mismatch"),
    ([f"V=DKIM1; K=RSA; P={KEY}"], "mismatch"),
    ([f"v=DKIM1; h=sha1; p={KEY}"], "mismatch"),
    ([f"v=DKIM1; s=foo; p={KEY}"], "mismatch"),
    ([f"v=DKIM1; s=tlsrpt; p={KEY}"], "mismatch"),
    # Not a tag list: a repeated tag, a part without a value.
    ([f"v=DKIM1; p={KEY}; p={KEY}"], "mismatch"),
    ([f"v=DKIM1; rsa; p={KEY}"], "mismatch"),
    # A receiver takes one record of several, whichever it is.
    ([f"v=DKIM1; k=rsa; p={KEY}", "v=DKIM1; k=rsa; p=AAAA"], "mismatch"),
    ([], "missing"),
])
def test_dkim(answers: list[str], status: Status) -> None:
    assert judge(DKIM, answers) == status


@pytest.mark.parametrize(("answers", "status"), [
    (["v=DMARC1; p=none;"], "verified"),
    (["v=DMARC1"], "verified"),
    (["v = DMARC1 ;p=reject; rua=mailto:d@example.com"], "verified"),
    (["hello", "v=DMARC1; p=quarantine"], "verified"),
    (["v=DMARC1x; p=none"], "mismatch"),
    (["v=dmarc1; p=none"], "mismatch"),
    (["v=DMARC1 p=none"], "mismatch"),
    (["p=none; v=DMARC1"], "mismatch"),
    (["hello"], "mismatch"),
    # Several DMARC records: receivers apply none.
    (["v=DMARC1; p=none", "v=DMARC1; p=reject"], "mismatch"),
    ([], "missing"),
])
def test_dmarc(answers: list[str], status: Status) -> None:
    assert judge(DMARC, answers) == status


def test_the_records_we_publish_are_verified() -> None:
    for record in records_for("example.com", dkim.new_selector(), KEY, HOST):
        assert judge(record, [record.value]) == "verified", record


def label_name(length: int) -> str:
    """A valid domain name of exactly ``length`` characters."""
    labels, left = [], length
    while left > 64:
        labels.append("a" * 62)
        left -= 63
    name = ".".join([*labels, "b" * (left - 4), "com"])
    assert len(name) == length
    return name


def test_sending_domain_length() -> None:
    """At the longest, the DKIM record name fits DNS (253) and the bounce
    address an SMTP path (254 between the angle brackets)."""
    longest = label_name(MAX_SENDING_LENGTH)
    assert sending_domain_name(longest) == longest
    for record in records_for(longest, dkim.new_selector(), KEY, HOST):
        assert len(record.name) <= 253, record.name
    assert len(f"{uuid.uuid4()}@{return_path_host(longest)}") <= 254
    for length in (MAX_SENDING_LENGTH + 1, 228, 229, 253):
        too_long = label_name(length)
        with pytest.raises(ValueError, match=r"at most 209 .*DKIM record name and bounce"):
            sending_domain_name(too_long)
        # Other names (an address's domain) keep DNS's limit.
        assert domain_name(too_long) == too_long
    assert MAX_SENDING_LENGTH == 209
