-- Which of the deliveries in ?1 (a JSON array of ids) still exist: a
-- heartbeat's leases it could not extend. Present means lost to an expiry or
-- another claim; absent means completed or cancelled (a dead letter stays and reads present).
-- Touches: deliveries (read).
SELECT d.id FROM json_each(?1) AS l JOIN deliveries d ON d.id = l.value
