"""The notifications outbox (gpuq.coordinator.notifications' durable deliveries): rows in, due ones
out oldest first, attempts recorded, rows deleted. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import math

from gpuq.store.api import Store
from gpuq.store.records import Notification


def test_outbox_rows_go_in_come_out_when_due_and_are_deleted(store: Store) -> None:
    mail = Notification(
        "mail", "ada@example.org", b"Subject: x\r\n\r\n\xff\x00", False, 0, 10.0, 10.0
    )
    hook = Notification("webhook", "https://h.example/x?t=1", b'{"a":1}', True, 0, 5.0, 5.0)
    later = Notification("webhook", "https://h.example/y", b"{}", False, 2, 100.0, 1.0)
    with store.transaction() as tx:
        ids = tx.add_notifications([mail, hook, later])
    assert len(set(ids)) == 3 and store.count_notifications() == 3
    mail_id, hook_id, later_id = ids
    # due at 50: the two, oldest (created_at) first, with every field as written
    assert store.due_notifications(50.0, 10) == [
        Notification("webhook", "https://h.example/x?t=1", b'{"a":1}', True, 0, 5.0, 5.0, hook_id),
        Notification(
            "mail", "ada@example.org", b"Subject: x\r\n\r\n\xff\x00", False, 0, 10.0, 10.0, mail_id
        ),
    ]
    assert [n.id for n in store.due_notifications(50.0, 1)] == [hook_id]
    assert [n.id for n in store.due_notifications(math.inf, 10)] == [later_id, hook_id, mail_id]
    # a failed attempt: counted, and not due until its next time
    with store.transaction() as tx:
        assert tx.retry_notification(hook_id, 1, 60.0)
    assert [n.id for n in store.due_notifications(50.0, 10)] == [mail_id]
    [again] = [n for n in store.due_notifications(60.0, 10) if n.id == hook_id]
    assert (again.attempts, again.next_at) == (1, 60.0)
    with store.transaction() as tx:
        assert tx.delete_notifications([hook_id, mail_id]) == 2
        assert tx.delete_notifications([hook_id]) == 0
        assert tx.delete_notifications([]) == 0
        assert not tx.retry_notification(hook_id, 2, 70.0)  # gone: nothing to record
    assert store.count_notifications() == 1
    assert [n.id for n in store.due_notifications(math.inf, 10)] == [later_id]


def test_outbox_ids_follow_the_order_of_writing(store: Store) -> None:
    rows = [
        Notification("mail", f"u{i}@example.org", b"m", False, 0, 1.0, float(i)) for i in range(5)
    ]
    with store.transaction() as tx:
        first = tx.add_notifications(rows[:2])
        second = tx.add_notifications(rows[2:])
    assert first + second == sorted(first + second)
    assert [n.target for n in store.due_notifications(1.0, 10)] == [r.target for r in rows]
    assert store.count_notifications() == 5
