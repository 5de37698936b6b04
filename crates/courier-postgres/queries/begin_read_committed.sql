-- Opens a transaction of the store's own at READ COMMITTED, whatever the
-- database's default isolation. Touches: nothing.
BEGIN ISOLATION LEVEL READ COMMITTED
