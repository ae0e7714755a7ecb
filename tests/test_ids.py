"""Random ids cut from a per-thread buffer: unique, version 4, per thread and
per forked process."""

from __future__ import annotations

import os
import threading
from uuid import RFC_4122

from tidings.ids import BUFFER_BYTES, new_id, random_bytes, token_hex


def test_ids_are_random_version_4_uuids_never_repeated() -> None:
    ids = [new_id() for _ in range(3 * BUFFER_BYTES)]  # across many buffers
    assert len(set(ids)) == len(ids)
    assert {i.version for i in ids} == {4} and {i.variant for i in ids} == {RFC_4122}
    assert len(token_hex(12)) == 24 and len(random_bytes(BUFFER_BYTES + 1)) == BUFFER_BYTES + 1


def test_threads_never_share_bytes() -> None:
    found: list[list[bytes]] = [[], [], [], []]

    def take(into: list[bytes]) -> None:
        into.extend(random_bytes(16) for _ in range(2000))

    threads = [threading.Thread(target=take, args=(into,)) for into in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [chunk for into in found for chunk in into]
    assert len(set(every)) == len(every) == 8000


def test_a_forked_child_does_not_hand_out_its_parents_bytes() -> None:
    new_id()  # the parent's buffer holds bytes it has not handed out yet
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, random_bytes(16))
        os._exit(0)
    os.close(write)
    from_child = os.read(read, 16)
    os.close(read)
    os.waitpid(child, 0)
    assert from_child != random_bytes(16)
