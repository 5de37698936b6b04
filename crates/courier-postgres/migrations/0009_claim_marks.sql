-- Courier's outbox schema, version 9: work that becomes claimable below the
-- claim floors is announced in the database, to every worker of every process.
--
-- Each store keeps per-tenant claim floors in memory (src/floors.rs) so that
-- claims under a held snapshot start past the dead index entries of work
-- already done. A delivery put back below a floor — a retry or snooze coming
-- due, a released or rescued lease, a retried dead letter, the next message of
-- an ordering key whose head was dead-lettered — used to be found by the
-- process that settled it (which lowers its own floors) or else by the next
-- full lap, which under a held snapshot could be minutes away. Now the
-- statement that puts it back also writes a mark here; every store reads the
-- due marks of the subscriptions it claims about once a second and lowers its
-- floors to them, and deletes marks whose delivery is no longer waiting.
-- Only those statements write marks, none of the hot path (claim, complete).
CREATE TABLE {schema}.claim_marks (
  subscription text        NOT NULL,
  delivery_id  bigint      NOT NULL,
  tenant       text        NOT NULL,
  due_at       timestamptz NOT NULL,
  PRIMARY KEY (subscription, delivery_id)
);
-- Readers walk a subscription's marks per tenant in id order.
CREATE INDEX claim_marks_tenant ON {schema}.claim_marks (subscription, tenant, delivery_id);
