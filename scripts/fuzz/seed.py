"""Seeds a freshly started daemon for scripts/fuzz-api and writes seeds.json.

What the fuzzer then finds in place: messages of tenants acme and globex
(one held for an hour, one with an idempotency key), three dead letters of
subscription fuzz-dead, a delivery of fuzz-hook waiting for its retry, and
stream `orders` of both tenants with group g1, consumer c1 and a pending
entry. Reads its settings from the CFUZZ_* variables fuzz-api sets.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone

import requests

BASE = os.environ["CFUZZ_BASE"]
TOKEN = os.environ["CFUZZ_ADMIN_TOKEN"]
SEEDS = os.environ["CFUZZ_SEEDS"]
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def call(method: str, path: str, body=None, expect=(200, 201)):
    response = requests.request(method, BASE + path, headers=HEADERS, json=body, timeout=30)
    if response.status_code not in expect:
        sys.exit(f"seed.py: {method} {path} answered {response.status_code}: {response.text}")
    return response.json()


def main() -> None:
    message_ids = []
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    for body in [
        {"tenant": "acme", "topic": "fuzzseed.hook", "payload": {"n": 1}},
        {"tenant": "globex", "topic": "fuzzseed.hook", "payload": {"n": 2}, "ordering_key": "k"},
        {"tenant": "acme", "topic": "fuzzseed.hook", "payload": {"n": 3}, "available_at": later},
        {"tenant": "acme", "topic": "fuzzseed.other", "payload": [1, 2], "idempotency_key": "fuzz-1"},
        {"tenant": "acme", "topic": "fuzzseed.dead", "payload": {"dead": 1}},
        {"tenant": "acme", "topic": "fuzzseed.dead", "payload": {"dead": 2}, "headers": {"x-a": "b"}},
        {"tenant": "globex", "topic": "fuzzseed.dead", "payload": {"dead": 3}},
    ]:
        message_ids.append(call("POST", "/v1/messages", body)["id"])

    # The daemon's first (refused) attempt dead-letters fuzz-dead's three.
    deadline = time.monotonic() + 30
    while True:
        dead = call("GET", "/v1/dead-letters?limit=500")["items"]
        if len(dead) >= 3:
            break
        if time.monotonic() > deadline:
            sys.exit(f"seed.py: {len(dead)} of 3 messages were dead-lettered within 30 s")
        time.sleep(0.2)
    dead_letter_ids = sorted(item["id"] for item in dead)

    for tenant in ("acme", "globex"):
        call(
            "POST",
            f"/v1/streams/{tenant}/orders/entries",
            {"entries": [{"payload": {"order": i}, "headers": {"h": "v"}} for i in range(3)]},
        )
        call("PUT", f"/v1/streams/{tenant}/orders/groups/g1", {"start": "beginning"})
        # On PostgreSQL an entry is readable once no transaction that began
        # before its own is open (the daemon's deliveries run beside us).
        deadline = time.monotonic() + 30
        while True:
            read = call(
                "POST",
                f"/v1/streams/{tenant}/orders/groups/g1/read",
                {"consumer": "c1", "count": 1, "block_ms": 500},
            )
            if len(read["entries"]) == 1:
                break
            if time.monotonic() > deadline:
                sys.exit(f"seed.py: the group read of {tenant}/orders gave {read} for 30 s")

    with open(SEEDS, "w", encoding="utf-8") as out:
        json.dump(
            {
                "message_ids": message_ids,
                "dead_letter_ids": dead_letter_ids,
                "subscriptions": ["fuzz-hook", "fuzz-dead"],
                "tenants": ["acme", "globex"],
                "streams": ["orders"],
                "groups": ["g1"],
                "consumers": ["c1"],
            },
            out,
        )


if __name__ == "__main__":
    main()
