-- Which of the deliveries $1 still exist (a heartbeat's leases it could not
-- extend: present means lost to an expiry or another claim, absent means
-- completed or cancelled; a dead letter stays and reads present). A statement of its own, after the
-- extension, so that its snapshot sees a completion the extension waited for.
SELECT id FROM {schema}.deliveries WHERE id = ANY ($1::bigint[])
