-- The database clock in milliseconds, as every stored time is written.
SELECT CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
