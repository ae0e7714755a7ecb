"""The piece index of GET /sms?search= (migration 0014): it never misses a match
of LIKE, answers terms of one to four characters exactly, and is what a search
reads."""

from __future__ import annotations

import pytest
import triopg

from tidings.service import Service
from tidings.storage.contacts import like_pattern

TEXTS = [
    "+14155550123\x1fshop\x1fyour code is 1234\x1fsmabc123",
    "+442079460958\x1facme\x1fgrüße aus berlin 😀 ticket 42\x1f",
    "it's a \\ back'slash: *&!|()<> -- 'quoted'",
    "a",
    "ab",
    "abcd",
    "abcde",
    "line one\nline two",
    "x\x01y and x\x02z",
    "Οδυσσέας ΟΔΥΣΣΕΥΣ",
]

TERMS = [
    "q", "Q", "s", "a", "😀", "ü", "Ü", "\n", "e\nl", "ς", "Σ", "ß", "SS",
    "ab", "Ab", "bc", "zq", "'", "\\", "*", ":", "&", "!", "(",
    "abc", "bcd", "ABCD", "abcde", "bcdef",
    "1234", "5550", "0958", "4155550123", "14155550123", "code is 1234", "ticket 42",
    "SMABC", "smabc123", "grÜsse", "grÜße", "berlin 😀", "back'sl", ":*", "'quoted'",
    "e\\ b", "x\x01y", "x\x02y", "x\x02z", "x\x01z", " ",
]


async def _index_and_like(service: Service, text: str, term: str) -> tuple[bool, bool]:
    async with service.db.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT sms_pieces(sms_fold($1::text)) @@ sms_pieces_query($2) AS indexed, "
            "sms_fold($1::text) LIKE sms_fold($3) AS matched",
            text, term, like_pattern(term),
        )
    return row["indexed"], row["matched"]


async def test_the_index_never_misses_a_match(service: Service) -> None:
    for text in TEXTS:
        for term in TERMS:
            indexed, matched = await _index_and_like(service, text, term)
            if matched:
                assert indexed, (text, term)


@pytest.mark.parametrize(
    ("text", "term", "expected"),
    [
        ("your code is 1234", "q", False),  # one character, absent
        ("your code is 1234", "Y", True),  # one character, present, other case
        ("your code is 1234", "4", True),  # the last character of the text
        ("your code is 1234", "34", True),
        ("your code is 1234", "43", False),
        ("your code is 1234", "e i", True),
        ("your code is 1234", "CODE", True),  # four characters: a whole piece
        ("your code is 1234", "codes", False),
        ("+14155550123", "5550", True),  # digits
        ("+14155550123", "5505", False),
        ("+14155550123", "4155550123", True),
        ("+14155550123", "4155550124", False),
        ("grüße 😀", "😀", True),
        ("grüße 😀", "ÜSSE", True),  # ß folds to ss, as in Unicode's case folding
        ("grüße 😀", "üßer", False),
        ("Οδυσσέας", "ΟΔΥΣΣΈΑΣ", True),  # the final sigma is a σ
        ("ΟΔΥΣΣΕΥΣ", "οδυσσευς", True),
        ("grüße 😀", "GRÜ", True),
        ("it's", "'", True),
        ("it's", "t's", True),
        ("a\\b", "\\", True),
        ("a\\b", "a\\b", True),
        ("", "a", False),
    ],
)
async def test_short_terms_are_answered_exactly(
    service: Service, text: str, term: str, expected: bool
) -> None:
    assert await _index_and_like(service, text, term) == (expected, expected)


@pytest.mark.parametrize("term", ["q", "Zq", "555", "5550123", "Order #77", "'"])
async def test_a_search_reads_the_piece_index(service: Service, term: str) -> None:
    """Even a term of one character is looked up (no walk through every row)."""
    async with service.db.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            row[0] for row in await conn.fetch(
                "EXPLAIN SELECT id FROM sms_messages WHERE sms_pieces(search) "
                "@@ sms_pieces_query($1) AND search LIKE lower($2)",
                term, like_pattern(term),
            )
        )
    assert "Bitmap Index Scan on sms_search" in plan, plan


FILL = r"""
INSERT INTO sms_messages (id, team_id, to_number, from_sender, body, encoding, segments,
                          status, provider, created_at)
SELECT gen_random_uuid(), $1, '+1415555' || lpad(i::text, 4, '0'), 'Shop',
       CASE WHEN i % 2 = 0 THEN 'Your order has shipped' ELSE 'Ticket ' || i::text END,
       'GSM-7', 1, 'delivered', 'sandbox', now() - i * interval '1 minute'
FROM generate_series(1, 2000) AS i
"""


async def test_a_longer_term_asks_for_its_rarer_pieces(service: Service) -> None:
    """Once analyzed, the pieces in half of the rows are left out of the look-up;
    what the look-up and strpos find is still every match."""
    async with service.db.acquire() as conn:
        team = await conn.fetchval("INSERT INTO teams (name) VALUES ('many') RETURNING id")
        await conn.execute(FILL, team)
        before = await conn.fetchval("SELECT sms_pieces_query('order 1')::text")
        await conn.execute("ANALYZE sms_messages")
        after = await conn.fetchval("SELECT sms_pieces_query('order 1')::text")
        assert "'orde'" in before
        assert "'orde'" not in after and "'rder'" not in after
        assert "'er 1'" in after and "'r 1'" not in after
        for term in ("order 1", "Ticket 1999", "ticket 19", "shipped", "0017"):
            found = await conn.fetchval(
                "SELECT count(*) FROM sms_messages WHERE team_id = $1 "
                "AND sms_pieces(search) @@ sms_pieces_query($2) "
                "AND strpos(search, lower($2)) > 0", team, term,
            )
            assert found == await conn.fetchval(
                "SELECT count(*) FROM sms_messages WHERE team_id = $1 "
                "AND strpos(search, lower($2)) > 0", team, term,
            ), term


async def test_the_piece_index_is_analyzed_whatever_the_search_path(
    service: Service, database_url: str
) -> None:
    """Autovacuum analyzes in a session of its own whose search_path is
    empty: the index's function names what it calls with its schema, or the
    table never gets statistics (the error only shows in PostgreSQL's log)."""
    async with service.db.acquire() as conn:
        team_id = await conn.fetchval("INSERT INTO teams (name) VALUES ('acme') RETURNING id")
        await conn.execute(
            "INSERT INTO sms_messages (id, team_id, to_number, from_sender, body, status,"
            " encoding, segments, country, provider)"
            " SELECT gen_random_uuid(), $1, '+14155550100', 'Acme', 'hello ' || n, 'queued',"
            " 'GSM-7', 1, 'US', 'sandbox' FROM generate_series(1, 50) n", team_id,
        )
    # A new session, as autovacuum's: nothing of the index read before.
    async with triopg.connect(database_url, server_settings={"search_path": ""}) as fresh:
        await fresh.execute("ANALYZE public.sms_messages")
        assert await fresh.fetchval(
            "SELECT count(*) FROM pg_catalog.pg_stats WHERE tablename = 'sms_search'") > 0
