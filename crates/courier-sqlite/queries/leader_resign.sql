-- Gives up holder ?1's maintenance lease. Touches: maintenance_leader. Locks: a write.
DELETE FROM maintenance_leader WHERE name = 'maintenance' AND holder = ?1
