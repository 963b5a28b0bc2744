"""The dashboard's revoked credentials (used sign-in tickets, signed-out sessions): kept by
digest until they would have expired, read back (by a restarted coordinator), and pruned once
expired. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from gpuq.store.api import Store

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_revoked_credentials_are_kept_until_they_expire(store: Store) -> None:
    assert store.revoked_web_credentials(0.0) == {}
    with store.transaction() as tx:
        assert tx.revoke_web_credentials({A: 100.0, B: 1000.5}, 10.0) == 0
    assert store.revoked_web_credentials(10.0) == {A: 100.0, B: 1000.5}
    assert store.revoked_web_credentials(100.0) == {A: 100.0, B: 1000.5}  # good until then
    assert store.revoked_web_credentials(100.5) == {B: 1000.5}  # expired: never asked for
    with store.transaction() as tx:  # one kept already stays, as it was
        assert tx.revoke_web_credentials({A: 500.0}, 50.0) == 0
    assert store.revoked_web_credentials(0.0) == {A: 100.0, B: 1000.5}
    with store.transaction() as tx:  # a later write prunes what expired
        assert tx.revoke_web_credentials({C: 2000.0}, 200.0) == 1
    assert store.revoked_web_credentials(0.0) == {B: 1000.5, C: 2000.0}
    with store.transaction() as tx:  # nothing new: only pruning
        assert tx.revoke_web_credentials({}, 1500.0) == 1
    assert store.revoked_web_credentials(0.0) == {C: 2000.0}


def test_revoked_credentials_outlive_the_store_connection(store_url: str) -> None:
    first = Store.open(store_url)
    try:
        with first.transaction() as tx:
            tx.revoke_web_credentials({A: 100.0}, 0.0)
    finally:
        first.close()
    second = Store.open(store_url)
    try:
        assert second.revoked_web_credentials(0.0) == {A: 100.0}
    finally:
        second.close()
