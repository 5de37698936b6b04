-- Gives up holder $1's maintenance lease, so another worker takes over at its
-- next try. Touches: maintenance_leader.
DELETE FROM {schema}.maintenance_leader WHERE name = 'maintenance' AND holder = $1
