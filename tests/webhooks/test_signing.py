"""The signature scheme against a fixed vector, and what verify() refuses."""

from __future__ import annotations

import pytest

from tidings.webhooks import Signer, WebhookVerificationError, signature_header, verify

# Computed independently: printf '%s' "1700000000.$BODY" | openssl dgst -sha256 -hmac "$SECRET"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TIMESTAMP = 1700000000
BODY = b'{"id":"0b0e2ad6-5c1b-4bd6-9f07-2f0c1e8f2a11","event":"webhook.test"}'
EXPECTED = "t=1700000000,v1=97d90f8cc9a9fd80ed000c100cecdda568f7af04656e8e71791d4c85597ffbce"


def test_header_matches_the_fixed_vector() -> None:
    assert signature_header([SECRET], TIMESTAMP, BODY) == EXPECTED


def test_verify_accepts_the_fixed_vector_and_returns_the_event() -> None:
    event = verify(BODY, EXPECTED, [SECRET], now=TIMESTAMP + 10)
    assert event == {"id": "0b0e2ad6-5c1b-4bd6-9f07-2f0c1e8f2a11", "event": "webhook.test"}


def test_two_secrets_give_two_signatures_and_either_verifies() -> None:
    old = "whsec_old"
    header = signature_header([SECRET, old], TIMESTAMP, BODY)
    assert header.startswith(EXPECTED + ",v1=")
    assert verify(BODY, header, [SECRET], now=TIMESTAMP)
    assert verify(BODY, header, [old], now=TIMESTAMP)


@pytest.mark.parametrize(
    ("payload", "header", "secrets", "now", "reason"),
    [
        (BODY + b" ", EXPECTED, [SECRET], TIMESTAMP, "no signature matches"),
        (BODY, EXPECTED, ["whsec_other"], TIMESTAMP, "no signature matches"),
        (BODY, EXPECTED, [SECRET], TIMESTAMP + 301, "outside the tolerance"),
        (BODY, EXPECTED, [SECRET], TIMESTAMP - 301, "outside the tolerance"),
        (BODY, EXPECTED.split(",")[1], [SECRET], TIMESTAMP, "no timestamp"),
        (BODY, EXPECTED.split(",")[0], [SECRET], TIMESTAMP, "no v1 signature"),
        (BODY, "t=soon," + EXPECTED.split(",")[1], [SECRET], TIMESTAMP, "bad timestamp"),
        (BODY, EXPECTED, [], TIMESTAMP, "no secret"),
        (BODY, EXPECTED.replace("v1=9", "v1=8"), [SECRET], TIMESTAMP, "no signature matches"),
    ],
)
def test_verify_refuses(
    payload: bytes, header: str, secrets: list[str], now: int, reason: str
) -> None:
    with pytest.raises(WebhookVerificationError, match=reason):
        verify(payload, header, secrets, now=now)


def test_tolerance_is_adjustable() -> None:
    assert verify(BODY, EXPECTED, [SECRET], tolerance=1000, now=TIMESTAMP + 900)
    with pytest.raises(WebhookVerificationError):
        verify(BODY, EXPECTED, [SECRET], tolerance=10, now=TIMESTAMP + 11)


def test_one_secret_given_as_a_string_is_a_type_error() -> None:
    # Each character would otherwise be tried as a secret: "w" would verify.
    forged = signature_header(["w"], TIMESTAMP, BODY)
    with pytest.raises(TypeError):
        verify(BODY, forged, SECRET, now=TIMESTAMP)  # type: ignore[arg-type]


def test_the_signer_makes_the_same_header_as_signature_header() -> None:
    old = "whsec_old"
    assert Signer([SECRET]).header(TIMESTAMP, BODY) == EXPECTED.encode()
    signer = Signer([SECRET, old])
    for _ in range(2):  # the keyed state is reused, never consumed
        assert signer.header(TIMESTAMP, BODY).decode() == signature_header(
            [SECRET, old], TIMESTAMP, BODY
        )
